package arbiterlock

import (
	"strings"
	"testing"
	"time"
)

func TestUnsafeTimingsAreRefusedAtConstruction(t *testing.T) {
	base := Options{LeaseName: "l", Namespace: "ns", Identity: "me", BinaryVersion: "1.31.0"}
	if _, err := base.withDefaults(); err != nil {
		t.Fatalf("the defaults (15 s / 10 s / 2 s) are safe: %v", err)
	}
	cases := []struct {
		lease, deadline, retry time.Duration
		says                   string
	}{
		{15 * time.Second, 13 * time.Second, 2 * time.Second, "unsafe timings"},
		{15 * time.Second, 15 * time.Second, 2 * time.Second, "0 < RetryPeriod"},
		{15 * time.Second, 10 * time.Second, 10 * time.Second, "0 < RetryPeriod"},
		{15500 * time.Millisecond, 10 * time.Second, 2 * time.Second, "whole seconds"},
		{60 * time.Second, 30 * time.Second, -time.Second, "0 < RetryPeriod"},
	}
	for _, c := range cases {
		o := base
		o.LeaseDuration, o.RenewDeadline, o.RetryPeriod = c.lease, c.deadline, c.retry
		_, err := o.withDefaults()
		if err == nil || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%v/%v/%v: got %v, want an error saying %q", c.lease, c.deadline, c.retry, err, c.says)
		}
	}
	o := base
	o.LeaseDuration, o.RenewDeadline, o.RetryPeriod = 4*time.Second, 2*time.Second, time.Second
	got, err := o.withDefaults()
	if err != nil || maxRenewLatency(got) != 500*time.Millisecond {
		t.Errorf("4/2/1 s is the tightest the margin allows: %v, latency bound %v", err, maxRenewLatency(got))
	}
}

func TestBadOptionsSayWhatIsWrong(t *testing.T) {
	t.Setenv("POD_NAMESPACE", "")
	t.Setenv("POD_NAME", "")
	t.Setenv("POD_UID", "")
	_, err := Options{Identity: "Me", BinaryVersion: "v1.31", PodName: "p"}.withDefaults()
	for _, says := range []string{"LeaseName is required", "Namespace is required", `Identity "Me"`, `BinaryVersion "v1.31"`, "PodName and PodUID go together"} {
		if err == nil || !strings.Contains(err.Error(), says) {
			t.Errorf("got %v, want it to say %q", err, says)
		}
	}
}

func TestTheEnvironmentFillsThePod(t *testing.T) {
	t.Setenv("POD_NAMESPACE", "apps")
	t.Setenv("POD_NAME", "ctrl-0")
	t.Setenv("POD_UID", "uid-1")
	o, err := Options{LeaseName: "l", BinaryVersion: "1.2.3"}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if o.Namespace != "apps" || o.Identity != "ctrl-0" || o.PodName != "ctrl-0" || o.PodUID != "uid-1" || o.EmulationVersion != "1.2.3" || o.Strategy != OldestEmulationVersion {
		t.Errorf("%+v", o)
	}
}
