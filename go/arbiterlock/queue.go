package arbiterlock

import "sync"

// queue runs functions one at a time, in the order pushed, on a goroutine of its own; push never
// waits for them (a callback that blocks holds up only the callbacks after it). Hand-written:
// a dozen lines, where a channel would block its sender once full.
type queue struct {
	mu      sync.Mutex
	pending []func()
	wake    chan struct{}
}

func newQueue() *queue {
	return &queue{wake: make(chan struct{}, 1)}
}

func (q *queue) push(f func()) {
	q.mu.Lock()
	q.pending = append(q.pending, f)
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// run calls what is pushed, forever.
func (q *queue) run() {
	for range q.wake {
		for {
			q.mu.Lock()
			if len(q.pending) == 0 {
				q.mu.Unlock()
				break
			}
			f := q.pending[0]
			q.pending = q.pending[1:]
			q.mu.Unlock()
			f()
		}
	}
}
