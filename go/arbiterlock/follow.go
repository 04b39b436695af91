package arbiterlock

import (
	"context"
	"fmt"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// followLease keeps l.lease up to date from a watch on the one Lease (relisting as informers
// do, so a restarted watch never looks like a deletion), until ctx ends.
func (l *Lock) followLease(ctx context.Context, kube kubernetes.Interface) cache.Controller {
	selector := fields.OneTermEqualSelector("metadata.name", l.opts.LeaseName).String()
	leases := kube.CoordinationV1().Leases(l.opts.Namespace)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = selector
			return leases.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = selector
			return leases.Watch(ctx, o)
		},
	}
	seen := func(obj any) {
		if lease, ok := obj.(*coordinationv1.Lease); ok {
			l.observe(lease.DeepCopy())
		}
	}
	_, informer := cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: lw,
		ObjectType:    &coordinationv1.Lease{},
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    seen,
			UpdateFunc: func(_, obj any) { seen(obj) },
			DeleteFunc: func(any) { l.observe(nil) },
		},
	})
	go informer.RunWithContext(ctx)
	return informer
}

// waitSynced waits until the Lease has been listed once.
func (l *Lock) waitSynced(ctx context.Context, informer cache.Controller) error {
	if !cache.WaitForCacheSync(ctx.Done(), informer.HasSynced) {
		return fmt.Errorf("the watch on lease %s/%s never listed it: %w", l.opts.Namespace, l.opts.LeaseName, ctx.Err())
	}
	l.mu.Lock()
	l.synced = true
	l.notify()
	l.mu.Unlock()
	return nil
}
