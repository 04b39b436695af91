// Command clientgo leads with plain client-go (leaderelection.RunOrDie) under arbiter: the
// client-go example of docs/guides/go-controllers.md, as the e2e tests run it.
//
// While it leads, it works in steps of --work-for, each logged with --log as "work ID TERM T0
// T1" (and "start ID TERM PID T" when a term starts, "stop ID T" when it exits; T in seconds
// since the epoch). SIGTERM stops the work, then releases the lease.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/arbiter-dev/arbiter/go/arbiterlock"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/klog/v2"
)

func main() {
	var (
		opts    arbiterlock.Options
		logPath string
		workFor time.Duration
	)
	flag.StringVar(&opts.LeaseName, "lease", "example-clientgo", "the Lease arbiter assigns")
	flag.StringVar(&opts.Namespace, "namespace", "", "the namespace of the Lease and the candidate (default $POD_NAMESPACE)")
	flag.StringVar(&opts.Identity, "identity", "", "this replica's name (default $POD_NAME, else the host name)")
	flag.StringVar(&opts.BinaryVersion, "binary-version", "1.0.0", "this replica's version")
	flag.DurationVar(&opts.LeaseDuration, "lease-duration", arbiterlock.DefaultLeaseDuration, "lease duration")
	flag.DurationVar(&opts.RenewDeadline, "renew-deadline", arbiterlock.DefaultRenewDeadline, "renew deadline")
	flag.DurationVar(&opts.RetryPeriod, "retry-period", arbiterlock.DefaultRetryPeriod, "retry period")
	flag.StringVar(&logPath, "log", "", "append start, work and stop lines to this file")
	flag.DurationVar(&workFor, "work-for", 20*time.Millisecond, "how long each step of work takes")
	flag.Parse()
	if err := run(opts, logPath, workFor); err != nil {
		klog.ErrorS(err, "exiting")
		os.Exit(1)
	}
}

func run(opts arbiterlock.Options, logPath string, workFor time.Duration) error {
	log := func(format string, args ...any) {
		if logPath == "" {
			return
		}
		f, err := os.OpenFile(logPath, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			return
		}
		defer f.Close()
		fmt.Fprintf(f, format+"\n", args...)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
		clientcmd.NewDefaultClientConfigLoadingRules(), nil).ClientConfig()
	if err != nil {
		return err
	}
	opts.OnStartedTerm = func(term int32) {
		log("start %s %d %d %s", opts.Identity, term, os.Getpid(), stamp(time.Now()))
	}
	lock, err := arbiterlock.New(ctx, cfg, opts)
	if err != nil {
		return err
	}
	opts = lock.Options()
	lock.SetExitAtTermEnd(true)
	var (
		mu      sync.Mutex
		stopped bool
		work    sync.WaitGroup
	)
	leaderelection.RunOrDie(lock.StepDownContext(ctx), lock.LeaderElectionConfig(leaderelection.LeaderCallbacks{
		OnStartedLeading: func(ctx context.Context) {
			mu.Lock()
			if stopped {
				mu.Unlock()
				return
			}
			work.Add(1)
			mu.Unlock()
			defer work.Done()
			for ctx.Err() == nil {
				term, err := lock.Term(ctx)
				if err != nil {
					return
				}
				t0 := time.Now()
				time.Sleep(workFor)
				log("work %s %d %s %s", opts.Identity, term, stamp(t0), stamp(time.Now()))
			}
		},
		OnStoppedLeading: func() {},
	}))
	mu.Lock()
	stopped = true
	mu.Unlock()
	work.Wait()
	released, err := lock.Shutdown(context.Background(), true)
	log("stop %s %s", opts.Identity, stamp(time.Now()))
	klog.InfoS("stopped", "released", released, "err", err)
	return nil
}

func stamp(t time.Time) string {
	return strconv.FormatFloat(float64(t.UnixNano())/1e9, 'f', 6, 64)
}
