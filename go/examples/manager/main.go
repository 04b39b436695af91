// Command manager is a controller-runtime manager whose leader election is arbiter's: the
// example of docs/guides/go-controllers.md, and the controller the e2e tests and the bench run.
//
// It reconciles one ConfigMap (--config-map): every reconcile counts itself in the ConfigMap
// with a fenced update (arbiterctrl.FencedUpdate) and comes back 50 ms later. Standbys serve its
// validating webhook (--webhook-port) and its probes (--probe-addr) like the leader.
//
// With --log it appends, for the tests, "start ID TERM PID T" when it starts leading, "work ID
// TERM T0 T1" for every reconcile (its start and end), and "stop ID T" when it exits (T in
// seconds since the epoch).
package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/arbiter-dev/arbiter/go/arbiterctrl"
	"github.com/arbiter-dev/arbiter/go/arbiterlock"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

func main() {
	var (
		opts        arbiterlock.Options
		configMap   string
		logPath     string
		probeAddr   string
		webhookPort int
		workFor     time.Duration
		election    string
		unwired     bool
	)
	flag.StringVar(&opts.LeaseName, "lease", "example-manager", "the Lease arbiter assigns")
	flag.StringVar(&opts.Namespace, "namespace", "", "the namespace of the Lease, the candidate and the ConfigMap (default $POD_NAMESPACE)")
	flag.StringVar(&opts.Identity, "identity", "", "this replica's name (default $POD_NAME, else the host name)")
	flag.StringVar(&opts.BinaryVersion, "binary-version", "1.0.0", "this replica's version")
	flag.StringVar(&opts.EmulationVersion, "emulation-version", "", "the version it behaves as (default the binary version)")
	flag.StringVar(&opts.Instance, "instance", "", "the arbiter install that arbitrates it")
	flag.DurationVar(&opts.LeaseDuration, "lease-duration", arbiterlock.DefaultLeaseDuration, "lease duration")
	flag.DurationVar(&opts.RenewDeadline, "renew-deadline", arbiterlock.DefaultRenewDeadline, "renew deadline")
	flag.DurationVar(&opts.RetryPeriod, "retry-period", arbiterlock.DefaultRetryPeriod, "retry period")
	flag.StringVar(&configMap, "config-map", "example-manager", "the ConfigMap it reconciles")
	flag.StringVar(&logPath, "log", "", "append start, work and stop lines to this file")
	flag.StringVar(&probeAddr, "probe-addr", ":8081", "the address of /healthz and /readyz")
	flag.IntVar(&webhookPort, "webhook-port", 0, "serve the validating webhook (/validate-configmap) on this port with a self-signed certificate (0: no webhook)")
	flag.DurationVar(&workFor, "work-for", 20*time.Millisecond, "how long each reconcile works")
	flag.BoolVar(&unwired, "no-step-down", false, "do not give the manager the lock's StepDownContext (a program that ignores handover requests: the tests' case)")
	flag.StringVar(&election, "election", "arbiter", "arbiter, or plain: controller-runtime's own leader election (a Lease it takes itself, released on cancel), the bench's baseline")
	zapOpts := zap.Options{}
	zapOpts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts)))
	if election == "plain" {
		err := runPlain(opts, configMap, logPath, probeAddr, workFor)
		if err != nil {
			ctrl.Log.Error(err, "exiting")
			os.Exit(1)
		}
		return
	}
	if err := run(opts, configMap, logPath, probeAddr, webhookPort, workFor, unwired); err != nil {
		ctrl.Log.Error(err, "exiting")
		os.Exit(1)
	}
}

func run(opts arbiterlock.Options, configMap, logPath, probeAddr string, webhookPort int, workFor time.Duration, unwired bool) error {
	events := &eventLog{path: logPath}
	opts.OnStartedTerm = func(term int32) {
		events.line("start %s %d %d %s", opts.Identity, term, os.Getpid(), stamp(time.Now()))
	}
	ctx := ctrl.SetupSignalHandler()
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return err
	}
	lock, err := arbiterlock.New(ctx, cfg, opts)
	if err != nil {
		return err
	}
	opts = lock.Options()
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	mopts := ctrl.Options{
		Scheme:                 scheme,
		HealthProbeBindAddress: probeAddr,
		Metrics:                server.Options{BindAddress: "0"},
		Cache:                  cache.Options{DefaultNamespaces: map[string]cache.Config{opts.Namespace: {}}},
	}
	if webhookPort != 0 {
		dir, err := selfSigned()
		if err != nil {
			return err
		}
		mopts.WebhookServer = webhook.NewServer(webhook.Options{Host: "127.0.0.1", Port: webhookPort, CertDir: dir})
	}
	mgr, err := ctrl.NewManager(cfg, arbiterctrl.Options(lock, mopts))
	if err != nil {
		return err
	}
	r := &reconciler{client: mgr.GetClient(), lock: lock, events: events, identity: opts.Identity, workFor: workFor}
	err = builder.ControllerManagedBy(mgr).For(&corev1.ConfigMap{}, builder.WithPredicates(predicate.NewPredicateFuncs(
		func(o client.Object) bool { return o.GetName() == configMap }))).Complete(r)
	if err != nil {
		return err
	}
	if webhookPort != 0 {
		mgr.GetWebhookServer().Register("/validate-configmap", &webhook.Admission{Handler: admission.HandlerFunc(validate(opts.Identity))})
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	ready := healthz.Ping
	if webhookPort != 0 {
		ready = mgr.GetWebhookServer().StartedChecker()
	}
	if err := mgr.AddReadyzCheck("ready", ready); err != nil {
		return err
	}
	if !unwired {
		ctx = lock.StepDownContext(ctx)
	}
	err = mgr.Start(ctx)
	// Released only if the manager stopped every reconcile: otherwise the lease expires.
	released, serr := lock.Shutdown(context.Background(), err == nil)
	events.line("stop %s %s", opts.Identity, stamp(time.Now()))
	ctrl.Log.Info("stopped", "released", released, "err", err, "shutdownErr", serr)
	return err
}

// reconciler counts its reconciles in the ConfigMap, fenced by the term.
type reconciler struct {
	client   client.Client
	lock     *arbiterlock.Lock
	events   *eventLog
	identity string
	workFor  time.Duration
}

func (r *reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	start := time.Now()
	var term int32
	if r.lock != nil {
		t, err := r.lock.Term(ctx)
		if err != nil {
			return reconcile.Result{}, err
		}
		term = t
	}
	cm := &corev1.ConfigMap{}
	cm.Name, cm.Namespace = req.Name, req.Namespace
	err := arbiterctrl.FencedUpdate(ctx, r.client, cm, term, func() error {
		n, _ := strconv.Atoi(cm.Data["reconciles"])
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
		cm.Data["reconciles"] = strconv.Itoa(n + 1)
		cm.Data["by"] = r.identity
		return nil
	})
	if errors.Is(err, arbiterlock.ErrStaleTerm) {
		ctrl.LoggerFrom(ctx).Info("a later term wrote the ConfigMap: this term is over", "term", term)
		return reconcile.Result{}, nil
	}
	if err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	time.Sleep(r.workFor)
	r.events.line("work %s %d %s %s", r.identity, term, stamp(start), stamp(time.Now()))
	return reconcile.Result{RequeueAfter: 50 * time.Millisecond}, nil
}

// validate admits every ConfigMap, saying which replica answered.
func validate(identity string) admission.HandlerFunc {
	return func(_ context.Context, _ admission.Request) admission.Response {
		resp := admission.Allowed("checked by " + identity)
		resp.Result.Code = http.StatusOK
		return resp
	}
}

// eventLog appends lines to a file (nothing without a path).
type eventLog struct {
	path string
	mu   sync.Mutex
}

func (e *eventLog) line(format string, args ...any) {
	if e.path == "" {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	f, err := os.OpenFile(e.path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return
	}
	defer f.Close()
	fmt.Fprintf(f, format+"\n", args...)
}

func stamp(t time.Time) string {
	return strconv.FormatFloat(float64(t.UnixNano())/1e9, 'f', 6, 64)
}

// selfSigned writes a certificate for 127.0.0.1 into a new directory, for the webhook server.
func selfSigned() (string, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "example-manager"},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return "", err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return "", err
	}
	dir, err := os.MkdirTemp("", "example-manager-certs")
	if err != nil {
		return "", err
	}
	write := func(name, kind string, b []byte) error {
		return os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: b}), 0o600)
	}
	if err := write("tls.crt", "CERTIFICATE", der); err != nil {
		return "", err
	}
	return dir, write("tls.key", "EC PRIVATE KEY", keyDER)
}

// runPlain is the same manager under controller-runtime's own leader election: the baseline
// `make bench` compares with. Its reconciles log term 0 (there is no fencing token).
func runPlain(opts arbiterlock.Options, configMap, logPath, probeAddr string, workFor time.Duration) error {
	events := &eventLog{path: logPath}
	ctx := ctrl.SetupSignalHandler()
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return err
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	lease, deadline, retry := opts.LeaseDuration, opts.RenewDeadline, opts.RetryPeriod
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                        scheme,
		HealthProbeBindAddress:        probeAddr,
		Metrics:                       server.Options{BindAddress: "0"},
		Cache:                         cache.Options{DefaultNamespaces: map[string]cache.Config{opts.Namespace: {}}},
		LeaderElection:                true,
		LeaderElectionID:              opts.LeaseName,
		LeaderElectionNamespace:       opts.Namespace,
		LeaderElectionReleaseOnCancel: true,
		LeaseDuration:                 &lease,
		RenewDeadline:                 &deadline,
		RetryPeriod:                   &retry,
	})
	if err != nil {
		return err
	}
	r := &reconciler{client: mgr.GetClient(), events: events, identity: opts.Identity, workFor: workFor}
	err = builder.ControllerManagedBy(mgr).For(&corev1.ConfigMap{}, builder.WithPredicates(predicate.NewPredicateFuncs(
		func(o client.Object) bool { return o.GetName() == configMap }))).Complete(r)
	if err != nil {
		return err
	}
	go func() {
		select {
		case <-mgr.Elected():
			events.line("start %s 0 %d %s", opts.Identity, os.Getpid(), stamp(time.Now()))
		case <-ctx.Done():
		}
	}()
	err = mgr.Start(ctx)
	events.line("stop %s %s", opts.Identity, stamp(time.Now()))
	return err
}
