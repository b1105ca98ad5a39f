package controlplane

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// startAttempts is how often a server is started on fresh ports when it
// exits during start-up (usually a port taken between pick and bind).
const startAttempts = 3

// Options tune Start. The zero value is a working default.
type Options struct {
	// AuthorizationMode is kube-apiserver's --authorization-mode; default
	// "Node,RBAC". The admin user is in system:masters either way.
	AuthorizationMode string
	// APIServerArgs are appended to kube-apiserver's flags (a repeated flag
	// overrides an earlier one), e.g. "--max-requests-inflight=800".
	APIServerArgs []string
	// EtcdOnTmpfs puts etcd's data dir on /dev/shm instead of t.TempDir(),
	// so fsync latency of the disk does not dominate write-heavy benchmarks.
	EtcdOnTmpfs bool
	// StartTimeout bounds each server's start-up; default 90s (the machine
	// is shared and may be busy).
	StartTimeout time.Duration
	// Verbosity is klog's -v for kube-apiserver and kube-scheduler.
	Verbosity int
	// EmulatedVersion, when set ("1.34"), makes kube-apiserver and
	// kube-scheduler emulate that older minor release (--emulated-version:
	// its APIs, their versions and its feature gates' defaults; 1.37 emulates
	// back to 1.34). The oldest-supported-version test runs on it.
	EmulatedVersion string
}

func (o Options) withDefaults() Options {
	if o.AuthorizationMode == "" {
		o.AuthorizationMode = "Node,RBAC"
	}
	if o.StartTimeout <= 0 {
		o.StartTimeout = 90 * time.Second
	}
	return o
}

// ControlPlane is a running etcd + kube-apiserver owned by one test.
type ControlPlane struct {
	opts Options
	dir  string
	bin  binaries
	pki  *pki

	apiURL              string
	kubeconfig          string
	schedulerKubeconfig string
	restConfig          *rest.Config
	client              kubernetes.Interface
	dynamic             dynamic.Interface

	mu         sync.Mutex
	procs      []*process // for log dumps
	schedulers int        // schedulers started, for unique file names
}

// Start runs etcd and kube-apiserver on loopback, writes an admin
// kubeconfig and waits for /readyz. It skips the test when the binaries are
// missing (see the package doc) and stops everything in t.Cleanup. ctx bounds
// the start-up API calls only; the servers live until the test ends.
func Start(ctx context.Context, t testing.TB, opts Options) *ControlPlane {
	t.Helper()
	began := time.Now()
	cp := &ControlPlane{opts: opts.withDefaults(), bin: findBinaries(t), dir: t.TempDir()}
	dumpOnFailure(t, cp.processes)

	var err error
	if cp.pki, err = newPKI(); err != nil {
		t.Fatalf("control plane: %v", err)
	}
	etcdURL, err := cp.startEtcd(t)
	if err != nil {
		t.Fatalf("control plane: %v", err)
	}
	if err := cp.startAPIServer(ctx, t, etcdURL); err != nil {
		t.Fatalf("control plane: %v", err)
	}
	if err := cp.CreateNamespace(ctx, metav1.NamespaceDefault); err != nil {
		t.Fatalf("control plane: %v", err)
	}
	t.Logf("control plane %s ready at %s in %v (dir %s)", K8sVersion, cp.apiURL, time.Since(began).Round(time.Millisecond), cp.dir)
	return cp
}

func (cp *ControlPlane) processes() []*process {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	return append([]*process(nil), cp.procs...)
}

func (cp *ControlPlane) nextSchedulerSeq() int {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	cp.schedulers++
	return cp.schedulers
}

// track records p for log dumps and stops it in t.Cleanup.
func (cp *ControlPlane) track(t testing.TB, p *process) {
	cp.mu.Lock()
	cp.procs = append(cp.procs, p)
	cp.mu.Unlock()
	t.Cleanup(p.stop)
}

func (cp *ControlPlane) startEtcd(t testing.TB) (string, error) {
	var lastErr error
	for attempt := 1; attempt <= startAttempts; attempt++ {
		dataDir, err := cp.etcdDataDir(t, attempt)
		if err != nil {
			return "", err
		}
		ports, err := freePorts(2)
		if err != nil {
			return "", err
		}
		clientURL := "http://" + hostPort(ports[0])
		peerURL := "http://" + hostPort(ports[1])
		args := []string{
			"--name=e2e",
			"--data-dir=" + dataDir,
			"--listen-client-urls=" + clientURL,
			"--advertise-client-urls=" + clientURL,
			"--listen-peer-urls=" + peerURL,
			"--initial-advertise-peer-urls=" + peerURL,
			"--initial-cluster=e2e=" + peerURL,
			"--initial-cluster-state=new",
			"--logger=zap",
			"--log-level=warn",
			"--quota-backend-bytes=4294967296",
		}
		p, err := startProcess("etcd", filepath.Join(cp.dir, "etcd.log"), cp.bin.etcd, args)
		if err != nil {
			return "", err
		}
		cp.track(t, p)
		hc := &http.Client{Timeout: 2 * time.Second}
		lastErr = p.waitReady(cp.opts.StartTimeout, func() error { return etcdHealthy(hc, clientURL) })
		if lastErr == nil {
			return clientURL, nil
		}
		p.stop()
		if !errors.Is(lastErr, errExited) {
			break
		}
		t.Logf("etcd attempt %d: %v; retrying on fresh ports", attempt, lastErr)
	}
	return "", fmt.Errorf("starting etcd: %w", lastErr)
}

func (cp *ControlPlane) etcdDataDir(t testing.TB, attempt int) (string, error) {
	if cp.opts.EtcdOnTmpfs {
		if fi, err := os.Stat(tmpfsRoot); err == nil && fi.IsDir() {
			sweepStaleTmpfs(tmpfsRoot)
			d, err := os.MkdirTemp(tmpfsRoot, tmpfsPrefix+strconv.Itoa(os.Getpid())+"-")
			if err != nil {
				return "", fmt.Errorf("creating etcd dir on tmpfs: %w", err)
			}
			t.Cleanup(func() { os.RemoveAll(d) })
			return d, nil
		}
		t.Logf("EtcdOnTmpfs: /dev/shm is missing; using the test's temp dir")
	}
	d := filepath.Join(cp.dir, "etcd-"+strconv.Itoa(attempt))
	if err := os.Mkdir(d, 0o700); err != nil {
		return "", fmt.Errorf("creating etcd dir: %w", err)
	}
	return d, nil
}

// tmpfs data dirs are named tmpfsPrefix<pid>-<random> under tmpfsRoot.
const (
	tmpfsRoot   = "/dev/shm"
	tmpfsPrefix = "understory-etcd-"
)

// sweepStaleTmpfs removes etcd data dirs left on tmpfs by test binaries
// that died without cleanup (e.g. killed by go test -timeout): they would
// hold memory until reboot.
func sweepStaleTmpfs(root string) {
	entries, err := os.ReadDir(root)
	if err != nil {
		return
	}
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), tmpfsPrefix)
		if !ok || !e.IsDir() {
			continue
		}
		pidStr, _, _ := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidStr)
		if err != nil || pid <= 0 || processAlive(pid) {
			continue
		}
		os.RemoveAll(filepath.Join(root, e.Name()))
	}
}

// processAlive reports whether pid exists (signal 0 succeeds or is refused).
func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

func etcdHealthy(hc *http.Client, clientURL string) error {
	resp, err := hc.Get(clientURL + "/health")
	if err != nil {
		return fmt.Errorf("probing etcd: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("etcd /health: %s", resp.Status)
	}
	return nil
}

// apiserver file names inside cp.dir.
const (
	caFile         = "ca.crt"
	servingCert    = "apiserver.crt"
	servingKey     = "apiserver.key"
	saKeyFile      = "sa.key"
	saPubFile      = "sa.pub"
	adminConfig    = "admin.kubeconfig"
	schedConfig    = "scheduler.kubeconfig"
	adminUser      = "understory-e2e-admin"
	schedulerUser  = "system:kube-scheduler"
	proxyCAFile    = "front-proxy-ca.crt"
	proxyCrt       = "front-proxy-client.crt"
	proxyKeyFile   = "front-proxy-client.key"
	frontProxyUser = "front-proxy-client"
)

func (cp *ControlPlane) path(name string) string { return filepath.Join(cp.dir, name) }

func (cp *ControlPlane) writePKI() error {
	srvCert, srvKey, err := cp.pki.issue(certRequest{
		commonName: "kube-apiserver",
		dnsNames:   []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
		ips:        []net.IP{net.IPv4(127, 0, 0, 1)},
		server:     true,
	})
	if err != nil {
		return err
	}
	// A separate CA for the aggregation layer's front proxy: the apiserver
	// publishes it in kube-system/extension-apiserver-authentication, which
	// kube-scheduler's delegated authentication reads (and logs errors about
	// when it is missing).
	proxyCA, err := newPKI()
	if err != nil {
		return err
	}
	proxyCert, proxyKey, err := proxyCA.issue(certRequest{commonName: frontProxyUser})
	if err != nil {
		return err
	}
	saPriv, saPub, err := serviceAccountKeys()
	if err != nil {
		return err
	}
	return writeFiles(map[string][]byte{
		cp.path(caFile):       cp.pki.certPEM,
		cp.path(servingCert):  srvCert,
		cp.path(servingKey):   srvKey,
		cp.path(saKeyFile):    saPriv,
		cp.path(saPubFile):    saPub,
		cp.path(proxyCAFile):  proxyCA.certPEM,
		cp.path(proxyCrt):     proxyCert,
		cp.path(proxyKeyFile): proxyKey,
	})
}

func (cp *ControlPlane) startAPIServer(ctx context.Context, t testing.TB, etcdURL string) error {
	if err := cp.writePKI(); err != nil {
		return err
	}
	var lastErr error
	for attempt := 1; attempt <= startAttempts; attempt++ {
		ports, err := freePorts(1)
		if err != nil {
			return err
		}
		cp.apiURL = "https://" + hostPort(ports[0])
		if err := cp.writeKubeconfigs(); err != nil {
			return err
		}
		args := []string{
			"--etcd-servers=" + etcdURL,
			"--bind-address=127.0.0.1",
			"--advertise-address=127.0.0.1",
			"--secure-port=" + strconv.Itoa(ports[0]),
			"--cert-dir=" + cp.path("apiserver-certs"),
			"--tls-cert-file=" + cp.path(servingCert),
			"--tls-private-key-file=" + cp.path(servingKey),
			"--client-ca-file=" + cp.path(caFile),
			"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
			"--service-account-key-file=" + cp.path(saPubFile),
			"--service-account-signing-key-file=" + cp.path(saKeyFile),
			"--service-cluster-ip-range=10.0.0.0/24",
			// The lease reconciler would publish 127.0.0.1 as the endpoint
			// of the "kubernetes" service, which validation rejects
			// (loopback) every 10 s.
			"--endpoint-reconciler-type=none",
			"--requestheader-client-ca-file=" + cp.path(proxyCAFile),
			"--requestheader-allowed-names=" + frontProxyUser,
			"--requestheader-username-headers=X-Remote-User",
			"--requestheader-group-headers=X-Remote-Group",
			"--requestheader-extra-headers-prefix=X-Remote-Extra-",
			"--proxy-client-cert-file=" + cp.path(proxyCrt),
			"--proxy-client-key-file=" + cp.path(proxyKeyFile),
			"--authorization-mode=" + cp.opts.AuthorizationMode,
			"--allow-privileged=true",
			"--disable-admission-plugins=TaintNodesByCondition",
			"--profiling=false",
			"--v=" + strconv.Itoa(cp.opts.Verbosity),
		}
		if v := cp.opts.EmulatedVersion; v != "" {
			args = append(args, "--emulated-version=kube="+v)
		}
		args = append(args, cp.opts.APIServerArgs...)
		p, err := startProcess("kube-apiserver", cp.path("kube-apiserver.log"), cp.bin.apiserver, args)
		if err != nil {
			return err
		}
		cp.track(t, p)
		if err := cp.buildClients(); err != nil {
			return err
		}
		lastErr = p.waitReady(cp.opts.StartTimeout, func() error { return cp.apiReady(ctx) })
		if lastErr == nil {
			return nil
		}
		p.stop()
		if !errors.Is(lastErr, errExited) {
			break
		}
		t.Logf("kube-apiserver attempt %d: %v; retrying on a fresh port", attempt, lastErr)
	}
	return fmt.Errorf("starting kube-apiserver: %w", lastErr)
}

func (cp *ControlPlane) apiReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if err := ctx.Err(); err != nil {
		return err
	}
	body, err := cp.client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
	if err != nil {
		return fmt.Errorf("kube-apiserver /readyz: %s: %w", body, err)
	}
	return nil
}

// writeKubeconfigs writes the admin and scheduler kubeconfigs for apiURL.
func (cp *ControlPlane) writeKubeconfigs() error {
	for _, u := range []struct {
		file, user string
		orgs       []string
	}{
		{adminConfig, adminUser, []string{"system:masters"}},
		{schedConfig, schedulerUser, nil},
	} {
		if err := cp.writeClientKubeconfig(cp.path(u.file), u.user, u.orgs...); err != nil {
			return err
		}
	}
	cp.kubeconfig = cp.path(adminConfig)
	cp.schedulerKubeconfig = cp.path(schedConfig)
	return nil
}

// writeClientKubeconfig writes a kubeconfig for user (a client certificate
// from the harness's CA) to file.
func (cp *ControlPlane) writeClientKubeconfig(file, user string, orgs ...string) error {
	cert, key, err := cp.pki.issue(certRequest{commonName: user, orgs: orgs})
	if err != nil {
		return err
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["e2e"] = &clientcmdapi.Cluster{Server: cp.apiURL, CertificateAuthorityData: cp.pki.certPEM}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{ClientCertificateData: cert, ClientKeyData: key}
	cfg.Contexts["e2e"] = &clientcmdapi.Context{Cluster: "e2e", AuthInfo: user,
		Namespace: metav1.NamespaceDefault}
	cfg.CurrentContext = "e2e"
	if err := clientcmd.WriteToFile(*cfg, file); err != nil {
		return fmt.Errorf("writing kubeconfig %s: %w", filepath.Base(file), err)
	}
	return nil
}

func (cp *ControlPlane) buildClients() error {
	cfg, err := clientcmd.BuildConfigFromFlags("", cp.kubeconfig)
	if err != nil {
		return fmt.Errorf("loading admin kubeconfig: %w", err)
	}
	cfg.QPS = -1 // no client-side rate limit
	cfg.UserAgent = "understory-e2e"
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("building clientset: %w", err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("building dynamic client: %w", err)
	}
	cp.restConfig, cp.client, cp.dynamic = cfg, cs, dyn
	return nil
}

// Client is an admin (system:masters) clientset without client-side rate
// limiting.
func (cp *ControlPlane) Client() kubernetes.Interface { return cp.client }

// Dynamic is an admin dynamic client without client-side rate limiting.
func (cp *ControlPlane) Dynamic() dynamic.Interface { return cp.dynamic }

// RESTConfig returns a copy of the admin REST config (QPS < 0: unlimited),
// for building other clients.
func (cp *ControlPlane) RESTConfig() *rest.Config { return rest.CopyConfig(cp.restConfig) }

// Kubeconfig is the path of the admin kubeconfig.
func (cp *ControlPlane) Kubeconfig() string { return cp.kubeconfig }

// URL is the apiserver's https URL on loopback.
func (cp *ControlPlane) URL() string { return cp.apiURL }

// Dir is the control plane's temp dir (logs, certs, kubeconfigs).
func (cp *ControlPlane) Dir() string { return cp.dir }

// CAFile is the harness CA's certificate (PEM): it signed the serving certificates of
// the API server, kube-scheduler and kube-controller-manager, and the client
// certificates of their users.
func (cp *ControlPlane) CAFile() string { return cp.path(caFile) }

// CreateNamespace creates namespace name (if it is not there) and its
// "default" ServiceAccount, which the missing ServiceAccount controller
// would otherwise create and the ServiceAccount admission plugin requires.
func (cp *ControlPlane) CreateNamespace(ctx context.Context, name string) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if _, err := cp.client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating namespace %s: %w", name, err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: name}}
	if _, err := cp.client.CoreV1().ServiceAccounts(name).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating default service account in %s: %w", name, err)
	}
	return nil
}
