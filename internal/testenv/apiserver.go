package testenv

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// EtcdVersion is the etcd release `make deps` builds (from the module in
// internal/testenv/etcdbuild).
const EtcdVersion = "v3.7.3"

// AdminUser is the identity StartAPIServer always makes: group
// system:masters, for a test's own set-up.
const AdminUser = "admin"

// APIUser is an identity of the test API server's token file.
type APIUser struct {
	Name   string
	Groups []string
}

// ServiceAccountUser is the identity the API server gives the token of
// service account ns/name: RBAC bindings whose subject is that service
// account apply to it, and nothing else does.
func ServiceAccountUser(ns, name string) APIUser {
	return APIUser{Name: "system:serviceaccount:" + ns + ":" + name,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}}
}

// APIServerOptions configures StartAPIServer.
type APIServerOptions struct {
	// Users are the identities besides AdminUser that can authenticate
	// (a token each).
	Users []APIUser
	// Args are more kube-apiserver flags.
	Args []string
}

// APIServer is a private kube-apiserver on a private etcd, both on
// loopback, as envtest sets them up: TLS with a certificate the server
// makes itself, token authentication, RBAC authorization, no controller
// manager and no scheduler (pods stay pending, no default service account:
// the ServiceAccount admission plugin is off).
type APIServer struct {
	// URL is the API server's address (https://127.0.0.1:port).
	URL string
	// CAFile verifies its serving certificate.
	CAFile string
	Dir    string

	t        testing.TB
	bin      string
	args     []string
	tokens   map[string]string // user name -> token
	etcd     *exec.Cmd
	etcdDone chan struct{}
	cmd      *exec.Cmd
	exited   chan struct{}
	logFile  string
	http     *http.Client
}

// binFrom returns name in the dir that env names (else the cache dir
// ~/.cache/gcagent/<sub>); a missing one fails the test under CI=true and
// skips it elsewhere.
func binFrom(t testing.TB, env, sub, name, what string) string {
	t.Helper()
	dir := os.Getenv(env)
	if dir == "" {
		home, _ := os.UserHomeDir()
		dir = filepath.Join(home, ".cache", "gcagent", sub)
	}
	bin := filepath.Join(dir, name)
	_, err := os.Stat(bin)
	Require(t, err == nil, what+" ("+bin+")")
	return bin
}

// APIServerPath returns the kube-apiserver `make deps` built.
func APIServerPath(t testing.TB) string {
	t.Helper()
	return binFrom(t, "GCAGENT_TEST_K8S_DIR", "k8s-"+KubeletVersion, "kube-apiserver", "kube-apiserver "+KubeletVersion)
}

// KubectlPath returns the kubectl `make deps` built.
func KubectlPath(t testing.TB) string {
	t.Helper()
	return binFrom(t, "GCAGENT_TEST_K8S_DIR", "k8s-"+KubeletVersion, "kubectl", "kubectl "+KubeletVersion)
}

// EtcdPath returns the etcd `make deps` built.
func EtcdPath(t testing.TB) string {
	t.Helper()
	return binFrom(t, "GCAGENT_TEST_ETCD_DIR", "etcd-"+EtcdVersion, "etcd", "etcd "+EtcdVersion)
}

// StartAPIServer starts etcd and kube-apiserver and waits until the API
// server is ready (its RBAC bootstrap roles made). Both are killed when the
// test ends.
func StartAPIServer(t testing.TB, opts APIServerOptions) *APIServer {
	t.Helper()
	apiBin, etcdBin := APIServerPath(t), EtcdPath(t)
	dir := t.TempDir()
	a := &APIServer{Dir: dir, t: t, bin: apiBin, tokens: map[string]string{}, logFile: filepath.Join(dir, "kube-apiserver.log")}
	t.Cleanup(a.cleanup)

	// etcd: its own data dir and ports; no fsync (a test's data need not
	// survive the machine, and a loaded machine's fsyncs take seconds).
	client, peer := "http://"+FreeAddr(t), "http://"+FreeAddr(t)
	etcdLog, err := os.Create(filepath.Join(dir, "etcd.log"))
	if err != nil {
		t.Fatal(err)
	}
	a.etcd = exec.Command(etcdBin, "--name=test", "--data-dir="+filepath.Join(dir, "etcd"),
		"--listen-client-urls="+client, "--advertise-client-urls="+client,
		"--listen-peer-urls="+peer, "--initial-advertise-peer-urls="+peer, "--initial-cluster=test="+peer,
		"--unsafe-no-fsync", "--log-level=warn")
	a.etcd.Stdout, a.etcd.Stderr = etcdLog, etcdLog
	a.etcd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := a.etcd.Start(); err != nil {
		t.Fatalf("start etcd: %v", err)
	}
	etcdLog.Close()
	a.etcdDone = make(chan struct{})
	go func() { _ = a.etcd.Wait(); close(a.etcdDone) }()

	// Identities: a token each, in the token file.
	var lines []string
	for _, u := range append([]APIUser{{Name: AdminUser, Groups: []string{"system:masters"}}}, opts.Users...) {
		tok := randomHex(t, 16)
		a.tokens[u.Name] = tok
		lines = append(lines, fmt.Sprintf("%s,%s,%s,%q", tok, u.Name, u.Name, strings.Join(u.Groups, ",")))
	}
	tokens := filepath.Join(dir, "tokens.csv")
	if err := os.WriteFile(tokens, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	saKey, saPub := filepath.Join(dir, "sa.key"), filepath.Join(dir, "sa.pub")
	writeRSAKeyPair(t, saKey, saPub)

	addr := FreeAddr(t)
	port := addr[strings.LastIndexByte(addr, ':')+1:]
	certDir := filepath.Join(dir, "certs")
	a.URL = "https://" + addr
	a.CAFile = filepath.Join(certDir, "apiserver.crt")
	a.args = append([]string{
		"--etcd-servers=" + client,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--secure-port=" + port,
		"--cert-dir=" + certDir,
		"--authorization-mode=RBAC", "--token-auth-file=" + tokens,
		"--service-account-key-file=" + saPub, "--service-account-signing-key-file=" + saKey,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-cluster-ip-range=10.0.0.0/24", "--allow-privileged=true",
		"--disable-admission-plugins=ServiceAccount",
		// The endpoints of service "kubernetes" cannot be a loopback address:
		// envtest turns the reconciler off too.
		"--endpoint-reconciler-type=none",
		"--v=1",
	}, opts.Args...)
	a.Start()
	return a
}

// Token returns the bearer token of user (AdminUser or one of the options').
func (a *APIServer) Token(user string) string {
	tok, ok := a.tokens[user]
	if !ok {
		a.t.Fatalf("testenv: the API server has no user %q", user)
	}
	return tok
}

// Config returns a client configuration for user.
func (a *APIServer) Config(user string) *rest.Config {
	return &rest.Config{Host: a.URL, BearerToken: a.Token(user), TLSClientConfig: rest.TLSClientConfig{CAFile: a.CAFile},
		QPS: 1000, Burst: 2000}
}

// Kubeconfig writes a kubeconfig file for user and returns its path: what
// the cluster component and kubectl are given.
func (a *APIServer) Kubeconfig(user string) string {
	a.t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["test"] = &clientcmdapi.Cluster{Server: a.URL, CertificateAuthority: a.CAFile}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: a.Token(user)}
	cfg.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: user}
	cfg.CurrentContext = "test"
	path := filepath.Join(a.Dir, "kubeconfig-"+strings.NewReplacer(":", "_", "/", "_").Replace(user))
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		a.t.Fatal(err)
	}
	return path
}

// Kubectl runs the kubectl `make deps` built as user and returns its
// combined output.
func (a *APIServer) Kubectl(user string, args ...string) (string, error) {
	a.t.Helper()
	cmd := exec.Command(KubectlPath(a.t), append([]string{"--kubeconfig=" + a.Kubeconfig(user)}, args...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// Start starts the API server (after Stop) and waits until it is ready.
func (a *APIServer) Start() {
	t := a.t
	t.Helper()
	if a.cmd != nil {
		t.Fatal("kube-apiserver already running")
	}
	logf, err := os.OpenFile(a.logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(a.bin, a.args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	err = cmd.Start()
	logf.Close()
	if err != nil {
		t.Fatalf("start kube-apiserver: %v", err)
	}
	a.cmd, a.exited = cmd, make(chan struct{})
	go func() { _ = cmd.Wait(); close(a.exited) }()
	// Generous: it is ready in a few seconds on an idle machine; these are
	// shared.
	deadline := time.Now().Add(3 * time.Minute)
	for {
		why := a.ready()
		if why == "" {
			return
		}
		select {
		case <-a.exited:
			a.cmd = nil
			t.Fatalf("kube-apiserver exited at start:\n%s", a.LogTail(40))
		case <-a.etcdDone:
			t.Fatalf("etcd exited:\n%s", tail(filepath.Join(a.Dir, "etcd.log"), 40))
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("kube-apiserver not ready after 3m (%s):\n%s", why, a.LogTail(40))
		}
	}
}

// ready says why the API server is not ready yet, or "".
func (a *APIServer) ready() string {
	if a.http == nil {
		ca, err := os.ReadFile(a.CAFile)
		if err != nil {
			return "no serving certificate yet"
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(ca) {
			return "serving certificate unreadable"
		}
		a.http = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	}
	req, _ := http.NewRequest(http.MethodGet, a.URL+"/readyz", nil)
	req.Header.Set("Authorization", "Bearer "+a.tokens[AdminUser])
	resp, err := a.http.Do(req)
	if err != nil {
		return err.Error()
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Sprintf("/readyz: %d %s", resp.StatusCode, strings.TrimSpace(string(b)))
	}
	return ""
}

// Stop stops the API server (SIGTERM, then SIGKILL after 30 s); etcd
// keeps its data, so Start brings the same cluster back.
func (a *APIServer) Stop() {
	if a.cmd == nil {
		return
	}
	_ = a.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-a.exited:
	case <-time.After(30 * time.Second):
		_ = a.cmd.Process.Kill()
		<-a.exited
	}
	a.cmd = nil
}

// LogTail returns the last n lines of the API server's log.
func (a *APIServer) LogTail(n int) string { return tail(a.logFile, n) }

func (a *APIServer) cleanup() {
	if a.t.Failed() && a.cmd != nil {
		a.t.Logf("kube-apiserver log tail:\n%s", a.LogTail(30))
	}
	a.Stop()
	if a.etcd != nil && a.etcd.Process != nil {
		_ = a.etcd.Process.Kill()
		<-a.etcdDone
	}
}

// tail returns the last n lines of the file at path.
func tail(path string, n int) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func randomHex(t testing.TB, n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// writeRSAKeyPair writes a new RSA key (PKCS#1) and its public key (PKIX),
// the service-account signing pair.
func writeRSAKeyPair(t testing.TB, keyPath, pubPath string) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(pubPath, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o644); err != nil {
		t.Fatal(err)
	}
}
