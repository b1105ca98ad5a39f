package e2e_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/understory/understory/contract"
	"github.com/understory/understory/internal/controlplane"
	"github.com/understory/understory/internal/kueueharness"
	"github.com/understory/understory/kueuequota"
)

// TestQuotaFollowerPolicy installs manifests/components/kueue (Kueue's CRDs first)
// on a real API server and writes as the quota follower's ServiceAccount and as a
// tenant:
//   - the follower may change the nominalQuota of a followed resource on a
//     ClusterQueue labelled understory.io/quota-follower=true, and spec.active plus
//     its label understory.io/quota-evicted on a Workload (deactivate, reactivate);
//   - it may not change an unlabelled ClusterQueue (nor label one to follow it),
//     another spec field, limit or resource of a followed one, its labels or
//     annotations, nor another field, label or annotation of a Workload;
//   - a tenant with write rights on its Workloads may not create one carrying
//     quota-evicted, nor add, change or remove the label; its other labels stay its own.
func TestQuotaFollowerPolicy(t *testing.T) {
	skipShort(t)
	bin := kueueharness.Find(t)
	ctx, cp := startControlPlane(t, 3*time.Minute)
	kubectl := controlplane.FindKubectl(t)
	kueueharness.InstallCRDs(ctx, t, cp, bin)
	applyKueueComponent(ctx, t, cp, kubectl)

	admin := cp.Dynamic()
	cqs := kueueharness.GVR("clusterqueues")
	wls := kueueharness.GVR("workloads")
	// An operator's ClusterQueue the follower does not follow, shaped like the
	// component's.
	other, err := admin.Resource(cqs).Get(ctx, kueueTenantA, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	other = &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": other.GetAPIVersion(), "kind": other.GetKind(),
		"metadata": map[string]any{"name": "unfollowed"},
		"spec":     other.Object["spec"],
	}}
	_ = unstructured.SetNestedField(other.Object, "unfollowed", "spec", "namespaceSelector", "matchLabels", "kubernetes.io/metadata.name")
	if _, err := admin.Resource(cqs).Create(ctx, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"w-follower", "w-tenant"} {
		if _, err := admin.Resource(wls).Namespace(kueueTenantA).Create(ctx, policyWorkload(name, nil), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	follower := impersonated(t, cp, contract.UserQuotaFollower)
	// A tenant allowed to write its Workloads (as a Job owner with edit rights on
	// Kueue's objects would be).
	grantWorkloads(ctx, t, cp, kueueTenantA, "alice")
	tenant := impersonated(t, cp, "alice")
	eventually(t, 30*time.Second, "alice's Role in force", func() (bool, string) {
		_, err := tenant.Resource(kueueharness.GVR("workloads")).Namespace(kueueTenantA).Get(ctx, "w-tenant", metav1.GetOptions{})
		return err == nil, fmt.Sprint(err)
	})

	// updateQueue: what the follower does (writeQuota: get, modify, update).
	updateQueue := func(name string, mutate func(obj map[string]any)) error {
		obj, err := follower.Resource(cqs).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		mutate(obj.Object)
		_, err = follower.Resource(cqs).Update(ctx, obj, metav1.UpdateOptions{})
		return err
	}
	quota := func(resource, value string) func(map[string]any) {
		return func(obj map[string]any) {
			flavorResources(obj, func(r map[string]any) {
				if r["name"] == resource {
					r["nominalQuota"] = value
				}
			})
		}
	}
	patchWorkload := func(c dynamic.Interface, name string, body any) error {
		_, err := c.Resource(wls).Namespace(kueueTenantA).Patch(ctx, name, types.MergePatchType, mergePatch(t, body), metav1.PatchOptions{})
		return err
	}
	// Both policies are picked up asynchronously: wait for each (a dry-run probe for
	// the tenant's fence, so that the probe itself creates nothing).
	waitPolicy(t, ctx, func() error { return updateQueue("unfollowed", quota(contract.ResourceBatchCPU, "1")) })
	waitPolicy(t, ctx, func() error {
		_, err := tenant.Resource(wls).Namespace(kueueTenantA).Create(ctx,
			policyWorkload("w-probe", map[string]any{kueuequota.LabelEvicted: "true"}),
			metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil && !strings.Contains(err.Error(), "(rule quota-evicted-writer)") {
			return nil // refused by something else (RBAC still settling): keep waiting
		}
		return err
	})

	// What the follower does.
	if err := updateQueue(kueueTenantA, quota(contract.ResourceBatchCPU, "3500")); err != nil {
		t.Errorf("the follower writing a followed queue's batch-cpu quota: %v", err)
	}
	if err := updateQueue(kueueTenantA, quota(contract.ResourceGPU, "2")); err != nil {
		t.Errorf("the follower writing a followed queue's GPU quota: %v", err)
	}
	deactivate := map[string]any{"metadata": map[string]any{"labels": map[string]any{kueuequota.LabelEvicted: "true"}},
		"spec": map[string]any{"active": false}}
	reactivate := map[string]any{"metadata": map[string]any{"labels": map[string]any{kueuequota.LabelEvicted: nil}},
		"spec": map[string]any{"active": true}}
	if err := patchWorkload(follower, "w-follower", deactivate); err != nil {
		t.Errorf("the follower deactivating a Workload: %v", err)
	}
	if err := patchWorkload(follower, "w-follower", reactivate); err != nil {
		t.Errorf("the follower reactivating a Workload: %v", err)
	}
	if err := patchWorkload(follower, "w-tenant", deactivate); err != nil {
		t.Errorf("the follower deactivating a Workload: %v", err)
	}
	got, err := admin.Resource(cqs).Get(ctx, kueueTenantA, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if q, err := kueuequota.NominalQuotas(got, kueuequota.DefaultFlavor, []string{contract.ResourceBatchCPU}); err != nil ||
		q[contract.ResourceBatchCPU] != 3500 {
		t.Errorf("tenant-a's batch-cpu quota %v (%v), want 3500", q, err)
	}

	cases := []struct {
		name string
		err  error
		want string // in the refusal: the rule
	}{
		{"follower: quota of an unlabelled queue", updateQueue("unfollowed", quota(contract.ResourceBatchCPU, "9")), "kueue-quota-followed-queues"},
		{"follower: labelling a queue to follow it", updateQueue("unfollowed", func(o map[string]any) {
			_ = unstructured.SetNestedField(o, "true", "metadata", "labels", kueuequota.LabelFollow)
		}), "kueue-quota-followed-queues"},
		{"follower: a followed queue's cohort", updateQueue(kueueTenantA, func(o map[string]any) {
			_ = unstructured.SetNestedField(o, "elsewhere", "spec", "cohortName")
		}), "kueue-quota-quota-only"},
		{"follower: a followed queue's preemption", updateQueue(kueueTenantA, func(o map[string]any) {
			_ = unstructured.SetNestedField(o, "Never", "spec", "preemption", "withinClusterQueue")
		}), "kueue-quota-quota-only"},
		{"follower: a borrowing limit", updateQueue(kueueTenantA, func(o map[string]any) {
			flavorResources(o, func(r map[string]any) {
				if r["name"] == contract.ResourceBatchCPU {
					r["borrowingLimit"] = "1"
				}
			})
		}), "kueue-quota-quota-only"},
		{"follower: the weight annotation", updateQueue(kueueTenantA, func(o map[string]any) {
			_ = unstructured.SetNestedField(o, "100", "metadata", "annotations", kueuequota.AnnotationWeight)
		}), "kueue-quota-quota-only"},
		{"follower: a queue label", updateQueue(kueueTenantA, func(o map[string]any) {
			_ = unstructured.SetNestedField(o, "x", "metadata", "labels", "example.com/team")
		}), "kueue-quota-quota-only"},
		{"follower: a Workload's priority", patchWorkload(follower, "w-follower", map[string]any{"spec": map[string]any{"priority": 1000}}),
			"kueue-quota-active-only"},
		{"follower: a Workload's queue", patchWorkload(follower, "w-follower", map[string]any{"spec": map[string]any{"queueName": "elsewhere"}}),
			"kueue-quota-active-only"},
		{"follower: a Workload's other label", patchWorkload(follower, "w-follower",
			map[string]any{"metadata": map[string]any{"labels": map[string]any{"app": "y"}}}), "kueue-quota-active-only"},
		{"follower: a Workload's annotation", patchWorkload(follower, "w-follower",
			map[string]any{"metadata": map[string]any{"annotations": map[string]any{"example.com/x": "y"}}}), "kueue-quota-active-only"},
		{"follower: quota-evicted with another value", patchWorkload(follower, "w-follower",
			map[string]any{"metadata": map[string]any{"labels": map[string]any{kueuequota.LabelEvicted: "yes"}}}), "kueue-quota-active-only"},
		{"tenant: creating a Workload with quota-evicted", func() error {
			_, err := tenant.Resource(wls).Namespace(kueueTenantA).Create(ctx,
				policyWorkload("w-forged", map[string]any{kueuequota.LabelEvicted: "true"}), metav1.CreateOptions{})
			return err
		}(), "quota-evicted-writer"},
		{"tenant: adding quota-evicted", patchWorkload(tenant, "w-follower",
			map[string]any{"metadata": map[string]any{"labels": map[string]any{kueuequota.LabelEvicted: "true"}}}), "quota-evicted-writer"},
		{"tenant: removing quota-evicted", patchWorkload(tenant, "w-tenant",
			map[string]any{"metadata": map[string]any{"labels": map[string]any{kueuequota.LabelEvicted: nil}}}), "quota-evicted-writer"},
	}
	for _, tc := range cases {
		if !apierrors.IsForbidden(tc.err) || !strings.Contains(tc.err.Error(), "(rule "+tc.want+")") {
			t.Errorf("%s: %v; want Forbidden by rule %s", tc.name, tc.err, tc.want)
		}
	}
	// The tenant's own labels stay its own: the fence is the one key.
	if err := patchWorkload(tenant, "w-tenant", map[string]any{"metadata": map[string]any{"labels": map[string]any{"app": "y"}},
		"spec": map[string]any{"active": true}}); err != nil {
		t.Errorf("the tenant changing its own label and spec.active: %v", err)
	}
}

// policyWorkload is a minimal Workload in tenant A's LocalQueue.
func policyWorkload(name string, labels map[string]any) *unstructured.Unstructured {
	l := map[string]any{"app": "x"}
	for k, v := range labels {
		l[k] = v
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": kueueharness.GVR("workloads").GroupVersion().String(), "kind": "Workload",
		"metadata": map[string]any{"name": name, "namespace": kueueTenantA, "labels": l},
		"spec": map[string]any{"queueName": kueueQueue, "podSets": []any{map[string]any{
			"name": "main", "count": int64(1),
			"template": map[string]any{"spec": map[string]any{"containers": []any{map[string]any{
				"name": "main", "image": "understory.invalid/pause:never-pulled"}}}},
		}}},
	}}
}

// flavorResources calls fn with each resources[] entry of every flavor of obj's
// spec.resourceGroups (the live maps).
func flavorResources(obj map[string]any, fn func(map[string]any)) {
	rgs, _ := obj["spec"].(map[string]any)["resourceGroups"].([]any)
	for _, rg := range rgs {
		fls, _ := rg.(map[string]any)["flavors"].([]any)
		for _, fl := range fls {
			rs, _ := fl.(map[string]any)["resources"].([]any)
			for _, r := range rs {
				fn(r.(map[string]any))
			}
		}
	}
}

// impersonated is a dynamic client acting as user (a service account's
// "system:serviceaccount:<ns>:<name>" or a plain user name).
func impersonated(t *testing.T, cp *controlplane.ControlPlane, user string) dynamic.Interface {
	t.Helper()
	rc := cp.RESTConfig()
	rc.Impersonate = rest.ImpersonationConfig{UserName: user}
	if strings.HasPrefix(user, "system:serviceaccount:") {
		ns := strings.Split(user, ":")[2]
		rc.Impersonate.Groups = []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}
	}
	c, err := dynamic.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// grantWorkloads lets user create, read and patch Workloads in ns.
func grantWorkloads(ctx context.Context, t *testing.T, cp *controlplane.ControlPlane, ns, user string) {
	t.Helper()
	name := fmt.Sprintf("%s-workloads", user)
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"kueue.x-k8s.io"}, Resources: []string{"workloads"},
			Verbs: []string{"get", "list", "create", "update", "patch"}}}}
	if _, err := cp.Client().RbacV1().Roles(ns).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: user}}}
	if _, err := cp.Client().RbacV1().RoleBindings(ns).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}
