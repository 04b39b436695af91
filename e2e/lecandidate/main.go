// Command lecandidate is the baseline for `make bench`: one leader-election candidate built on
// client-go, either plain leader election (each candidate grabs the Lease itself, client-go's
// default timings) or upstream coordinated leader election (KEP-4355: a coordination.k8s.io
// LeaseCandidate from NewCandidate, and a LeaderElector with Coordinated: true that only leads
// once kube-apiserver's election controller names it holder).
//
// It appends "start ID T" when it starts leading and "stop ID T" when it stops (T in seconds
// since the epoch) to --log, the same lines the bench's arbiter workloads write. SIGTERM
// cancels the elector, which releases the Lease (ReleaseOnCancel) and exits.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

func main() {
	kubeconfig := flag.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig")
	namespace := flag.String("namespace", "default", "namespace of the Lease and the candidate")
	lease := flag.String("lease", "", "Lease name")
	identity := flag.String("identity", "", "candidate identity")
	mode := flag.String("mode", "plain", "plain (client-go leader election) or coordinated (KEP-4355)")
	binaryVersion := flag.String("binary-version", "1.30.0", "binary version (coordinated mode)")
	emulationVersion := flag.String("emulation-version", "", "emulation version (coordinated mode; defaults to the binary version)")
	logPath := flag.String("log", "", "file to append start/stop lines to")
	leaseDuration := flag.Duration("lease-duration", 15*time.Second, "lease duration")
	renewDeadline := flag.Duration("renew-deadline", 10*time.Second, "renew deadline")
	retryPeriod := flag.Duration("retry-period", 2*time.Second, "retry period")
	flag.Parse()
	if *lease == "" || *identity == "" || *logPath == "" {
		fmt.Fprintln(os.Stderr, "--lease, --identity and --log are required")
		os.Exit(2)
	}
	if *emulationVersion == "" {
		*emulationVersion = *binaryVersion
	}

	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fatal(err)
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		fatal(err)
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()

	coordinated := false
	switch *mode {
	case "plain":
	case "coordinated":
		coordinated = true
		candidate, synced, err := leaderelection.NewCandidate(client, *namespace, *identity, *lease,
			*binaryVersion, *emulationVersion, coordinationv1.OldestEmulationVersion)
		if err != nil {
			fatal(err)
		}
		go candidate.Run(ctx)
		synced.WaitForCacheSync(ctx.Done())
	default:
		fatal(fmt.Errorf("unknown --mode %q", *mode))
	}

	var led atomic.Bool
	stopped := make(chan struct{})
	var mu sync.Mutex
	record := func(what string) {
		mu.Lock()
		defer mu.Unlock()
		f, err := os.OpenFile(*logPath, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			fatal(err)
		}
		now := time.Now()
		fmt.Fprintf(f, "%s %s %d.%09d\n", what, *identity, now.Unix(), now.Nanosecond())
		f.Close()
	}

	elector, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: &resourcelock.LeaseLock{
			LeaseMeta:  metav1.ObjectMeta{Namespace: *namespace, Name: *lease},
			Client:     client.CoordinationV1(),
			LockConfig: resourcelock.ResourceLockConfig{Identity: *identity},
		},
		LeaseDuration:   *leaseDuration,
		RenewDeadline:   *renewDeadline,
		RetryPeriod:     *retryPeriod,
		ReleaseOnCancel: true,
		Coordinated:     coordinated,
		Name:            *lease,
		Callbacks: leaderelection.LeaderCallbacks{
			// The "workload" runs until its context ends, which client-go cancels when
			// leadership ends (at the same time as it releases the Lease).
			OnStartedLeading: func(ctx context.Context) {
				led.Store(true)
				record("start")
				<-ctx.Done()
				record("stop")
				close(stopped)
			},
			OnStoppedLeading: func() {},
		},
	})
	if err != nil {
		fatal(err)
	}
	elector.Run(ctx)
	if led.Load() {
		<-stopped
	}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "lecandidate:", err)
	os.Exit(1)
}
