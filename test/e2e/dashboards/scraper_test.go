package dashboards

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/understory/understory/internal/testenv"
)

// The second scheduler's /metrics is kube-scheduler's: it answers only a client the
// API server authenticates (TokenReview) and authorises (a SubjectAccessReview for get
// on the non-resource URL /metrics). The test scrapes it as a Prometheus in the
// cluster does: with its service account's token, the account bound to the ClusterRole
// the second-scheduler component ships, as the Helm chart's
// secondScheduler.prometheusServiceAccount binds it.
const (
	// secondSchedulerMetrics holds that ClusterRole, relative to the module root.
	secondSchedulerMetrics = "manifests/components/second-scheduler/metrics.yaml"
	metricsReaderRole      = "understory-scheduler-metrics-reader"
	scraperNamespace       = "monitoring"
	scraperAccount         = "prometheus"
	// strangerAccount has a token but no binding: kube-scheduler must refuse it.
	strangerAccount = "stranger"
	// secondSchedulerJob is the second scheduler's scrape job in
	// manifests/monitoring/prometheus-scrape.yaml (and its Service's name, the
	// ServiceMonitor's job): the dashboard's panels and the alerts select it.
	secondSchedulerJob = "understory-scheduler"
)

// schedulerScrapeJob binds the shipped ClusterRole understory-scheduler-metrics-reader
// to the service account monitoring/prometheus and writes that account's token to a
// file. It checks that kube-scheduler refuses /metrics to an anonymous client and to
// an account without the binding, and serves it with the token; and returns the scrape
// job: https verified against the control plane's CA, the token as bearer.
func (c *cluster) schedulerScrapeJob(ctx context.Context, t *testing.T) ScrapeJob {
	t.Helper()
	root, err := testenv.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(root, secondSchedulerMetrics))
	if err != nil {
		t.Fatal(err)
	}
	docs, err := selectDocs(raw, func(o map[string]any) bool {
		md, _ := o["metadata"].(map[string]any)
		return o["kind"] == "ClusterRole" && md["name"] == metricsReaderRole
	})
	if err != nil || len(docs) != 1 {
		t.Fatalf("%s: want the ClusterRole %s (%v)", secondSchedulerMetrics, metricsReaderRole, err)
	}
	var role rbacv1.ClusterRole
	if err := yaml.Unmarshal(docs[0], &role); err != nil {
		t.Fatal(err)
	}
	client := c.cp.Client()
	if _, err := client.RbacV1().ClusterRoles().Create(ctx, &role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.cp.CreateNamespace(ctx, scraperNamespace); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: metricsReaderRole},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: metricsReaderRole},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: scraperNamespace, Name: scraperAccount}},
	}
	if _, err := client.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tokens := map[string]string{}
	for _, name := range []string{scraperAccount, strangerAccount} {
		sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: scraperNamespace}}
		if _, err := client.CoreV1().ServiceAccounts(scraperNamespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		expiry := int64(time.Hour / time.Second)
		tr, err := client.CoreV1().ServiceAccounts(scraperNamespace).CreateToken(ctx, name,
			&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiry}},
			metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("a token for %s/%s: %v", scraperNamespace, name, err)
		}
		tokens[name] = tr.Status.Token
	}

	ca, err := os.ReadFile(c.cp.CAFile())
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		t.Fatalf("%s holds no certificate", c.cp.CAFile())
	}
	hc := &http.Client{Timeout: 5 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	defer hc.CloseIdleConnections()
	url := c.sched.URL() + "/metrics"
	for _, tc := range []struct {
		who, token string
		want       []int
	}{
		// Without credentials kube-scheduler's delegated authentication makes the
		// caller system:anonymous, whom nothing allows /metrics.
		{"anonymous", "", []int{http.StatusUnauthorized, http.StatusForbidden}},
		{"an account without the binding", tokens[strangerAccount], []int{http.StatusForbidden}},
	} {
		code, body, err := getMetrics(ctx, hc, url, tc.token)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(tc.want, code) {
			t.Fatalf("kube-scheduler's /metrics for %s: %d %s, want one of %v", tc.who, code, body, tc.want)
		}
	}
	// kube-scheduler caches each review's answer for 10 s: poll until the binding,
	// made just before, is seen.
	var code int
	var body string
	var getErr error
	served := testenv.PollEvery(30*time.Second, 500*time.Millisecond, func() bool {
		code, body, getErr = getMetrics(ctx, hc, url, tokens[scraperAccount])
		return getErr != nil || (code == http.StatusOK && strings.Contains(body, "scheduler_pending_pods"))
	})
	if getErr != nil {
		t.Fatal(getErr)
	}
	if !served {
		t.Fatalf("kube-scheduler's /metrics for %s/%s (bound to %s): %d %.200s", scraperNamespace, scraperAccount,
			metricsReaderRole, code, body)
	}
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(tokens[scraperAccount]), 0o600); err != nil {
		t.Fatal(err)
	}
	return ScrapeJob{Name: secondSchedulerJob, Scheme: "https", TLS: &TLSConfig{CAFile: c.cp.CAFile()},
		BearerTokenFile: tokenFile, Targets: []ScrapeTarget{{Address: strings.TrimPrefix(c.sched.URL(), "https://")}}}
}

// getMetrics GETs url with token as bearer ("" none) and returns the status and body.
func getMetrics(ctx context.Context, hc *http.Client, url, token string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, "", fmt.Errorf("GET %s: %w", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(b), err
}
