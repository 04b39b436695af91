package arbiterlock

import "time"

// started anchors monotonic.
var started = time.Now()

// monotonic is Go's monotonic clock, as a duration since the package started.
func monotonic() time.Duration {
	return time.Since(started)
}
