package arbiterlock

import (
	"bytes"
	"os"

	"github.com/go-logr/logr"
)

// recordIncarnation writes this process's incarnation to its container's termination log (a
// regular file, never created here), and only if the container has a PID namespace of its own:
// then the container's end proves this process and all it started are gone, and the arbiter
// hands the lease on at once when the kubelet reports it. In a PID namespace shared with the
// pod or the host, processes may outlive the container's report: nothing is written.
func recordIncarnation(log logr.Logger, path, incarnation string) {
	if st, err := os.Stat(path); err != nil || !st.Mode().IsRegular() {
		log.V(1).Info("no termination log: not in a pod", "path", path)
		return
	}
	if !ownPIDNamespace() {
		log.Info("the container shares its PID namespace: a crash of this container will be handed on only once the lease expires")
		return
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if err == nil {
		_, err = f.WriteString(terminationMessage(incarnation))
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		log.Info("cannot write the termination log: a crash of this container will be handed on only once the lease expires", "path", path, "err", err)
	}
}

// ownPIDNamespace: pid 1 is in this process's cgroup (in a namespace shared with the pod, pid 1
// is the sandbox's pause process; with the host's, the host's init).
func ownPIDNamespace() bool {
	a, err1 := os.ReadFile("/proc/1/cgroup")
	b, err2 := os.ReadFile("/proc/self/cgroup")
	return err1 == nil && err2 == nil && bytes.Equal(a, b)
}
