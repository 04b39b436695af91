package arbiterlock

import (
	"time"

	"golang.org/x/sys/unix"
)

// boot reads CLOCK_BOOTTIME: monotonic, and unlike Go's monotonic clock (CLOCK_MONOTONIC) it
// counts the time a suspended machine slept. (Hand-written: Go's time package has no boot
// clock.) Should the read fail, Go's monotonic clock stands in.
func boot() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return monotonic()
	}
	return time.Duration(ts.Nano())
}
