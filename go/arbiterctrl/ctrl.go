// Package arbiterctrl puts a controller-runtime manager's leader election under arbiter.
//
//	lock, err := arbiterlock.New(ctx, cfg, arbiterlock.Options{LeaseName: "my-controller", BinaryVersion: version})
//	mgr, err := ctrl.NewManager(cfg, arbiterctrl.Options(lock, ctrl.Options{Scheme: scheme}))
//	err = mgr.Start(lock.StepDownContext(ctx))
//	lock.Shutdown(context.Background(), err == nil)
package arbiterctrl

import (
	"context"
	"fmt"

	"github.com/arbiter-dev/arbiter/go/arbiterlock"
	"k8s.io/client-go/util/retry"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Options is opts with leader election under lock:
//
//   - leader election on, the lock as the resource lock, the lease's name as the election's ID,
//     and the lock's timings;
//   - the elector's own release off: the lock releases in Shutdown, once mgr.Start returned nil;
//   - a graceful shutdown of at most the lock's StepDownGrace (the lock renews during a handover
//     only that long). Zero, or negative (wait forever), is StepDownGrace too: with no wait,
//     mgr.Start returns nil while reconciles may still run, and Shutdown would release under them;
//   - controllers warm up on standbys (EnableWarmup, unless set): their sources and caches start
//     before the replica leads, so that a new leader reconciles at once;
//   - the lock's ExitAtTermEnd on: if a term ends while the manager still runs (its graceful
//     shutdown outlasting a lost lease), the process exits at the last moment it may act.
func Options(lock *arbiterlock.Lock, opts ctrl.Options) ctrl.Options {
	o := lock.Options()
	lease, deadline, retry := o.LeaseDuration, o.RenewDeadline, o.RetryPeriod
	opts.LeaderElection = true
	opts.LeaderElectionID = o.LeaseName
	opts.LeaderElectionNamespace = o.Namespace
	opts.LeaderElectionResourceLockInterface = lock
	opts.LeaderElectionReleaseOnCancel = false
	opts.LeaseDuration, opts.RenewDeadline, opts.RetryPeriod = &lease, &deadline, &retry
	grace := o.StepDownGrace
	if g := opts.GracefulShutdownTimeout; g != nil && *g > 0 && *g < grace {
		grace = *g
	}
	opts.GracefulShutdownTimeout = &grace
	if opts.Controller.EnableWarmup == nil {
		warm := true
		opts.Controller.EnableWarmup = &warm
	}
	lock.SetExitAtTermEnd(true)
	return opts
}

// FencedUpdate reads obj (by its name and namespace), fences it at term
// (arbiterlock.Fence), applies mutate and writes it back with the resourceVersion read,
// retrying on conflict. It returns arbiterlock.ErrStaleTerm (wrapped) when a later term wrote
// obj: the caller's term is over.
func FencedUpdate(ctx context.Context, c client.Client, obj client.Object, term int32, mutate func() error) error {
	key := client.ObjectKeyFromObject(obj)
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := c.Get(ctx, key, obj); err != nil {
			return err
		}
		if err := arbiterlock.Fence(obj, term); err != nil {
			return err
		}
		if err := mutate(); err != nil {
			return fmt.Errorf("arbiterctrl: mutating %s: %w", key, err)
		}
		return c.Update(ctx, obj)
	})
}
