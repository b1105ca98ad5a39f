package e2e_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/understory/understory/internal/controlplane"
	"github.com/understory/understory/internal/testenv"
	"github.com/understory/understory/test/e2e/manifestcopy"
)

// manifestsDir is the repository's manifests/, relative to this package.
const manifestsDir = "../../manifests"

// kubectl runs the kubectl of the control-plane binaries cache against a
// kubeconfig ("" for commands that need no cluster, e.g. kustomize).
type kubectl struct {
	bin, kubeconfig string
}

func newKubectl(t *testing.T, kubeconfig string) kubectl {
	t.Helper()
	return kubectl{bin: controlplane.FindKubectl(t), kubeconfig: kubeconfig}
}

// run returns kubectl's stdout; an error carries its stderr.
func (k kubectl) run(ctx context.Context, args ...string) (string, error) {
	if k.kubeconfig != "" {
		args = append([]string{"--kubeconfig", k.kubeconfig}, args...)
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, k.bin, args...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("kubectl %s: %w\n%s%s", strings.Join(args, " "), err, errOut.String(), out.String())
	}
	return out.String(), nil
}

// must is run, failing the test on error.
func (k kubectl) must(t *testing.T, ctx context.Context, args ...string) string {
	t.Helper()
	out, err := k.run(ctx, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// build runs `kubectl kustomize dir` and returns its objects in order.
func (k kubectl) build(t *testing.T, ctx context.Context, dir string) []*unstructured.Unstructured {
	t.Helper()
	out := k.must(t, ctx, "kustomize", dir)
	objs, err := controlplane.DecodeObjects([]byte(out))
	if err != nil {
		t.Fatalf("kustomize %s: %v", dir, err)
	}
	return objs
}

// find returns the object of kind and name in objs, or nil.
func find(objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	return nil
}

// mustFind is find that fails the test when the object is missing.
func mustFind(t *testing.T, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	o := find(objs, kind, name)
	if o == nil {
		t.Fatalf("no %s %s", kind, name)
	}
	return o
}

// copyManifests copies the repository's manifests/ (without certificates it
// generated) into a temp dir and runs certs/generate.sh there, so that tests
// never write into the source tree. It returns the copy's root.
func copyManifests(t *testing.T) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "manifests")
	if err := manifestcopy.Copy(manifestsDir, dst); err != nil {
		if errors.Is(err, manifestcopy.ErrNoOpenSSL) {
			testenv.SkipOrFailInCI(t, "%v", err)
		}
		t.Fatal(err)
	}
	return dst
}

// saToken requests a token for service account ns/name, bound to obj when set
// (kind Pod or Node: the API server then adds the node-name claim).
func saToken(t *testing.T, ctx context.Context, c kubernetes.Interface, ns, name string,
	obj *authenticationv1.BoundObjectReference) string {
	t.Helper()
	expiry := int64(3600)
	tr, err := c.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiry, BoundObjectRef: obj},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token for %s/%s: %v", ns, name, err)
	}
	return tr.Status.Token
}

// tokenConfig is the control plane's REST config authenticating with token
// instead of the admin certificate.
func tokenConfig(cp *controlplane.ControlPlane, token string) *rest.Config {
	rc := cp.RESTConfig()
	rc.CertData, rc.KeyData, rc.CertFile, rc.KeyFile = nil, nil, "", ""
	rc.BearerToken = token
	rc.UserAgent = "understory-e2e-token"
	return rc
}

func tokenClient(t *testing.T, cp *controlplane.ControlPlane, token string) kubernetes.Interface {
	t.Helper()
	c, err := kubernetes.NewForConfig(tokenConfig(cp, token))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// writeTokenKubeconfig writes a kubeconfig that authenticates with token.
func writeTokenKubeconfig(t *testing.T, cp *controlplane.ControlPlane, token string) string {
	t.Helper()
	rc := cp.RESTConfig()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["e2e"] = &clientcmdapi.Cluster{Server: rc.Host, CertificateAuthorityData: rc.CAData}
	cfg.AuthInfos["sa"] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["e2e"] = &clientcmdapi.Context{Cluster: "e2e", AuthInfo: "sa"}
	cfg.CurrentContext = "e2e"
	path := filepath.Join(t.TempDir(), "sa.kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}
