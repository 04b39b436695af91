//go:build !linux

package arbiterlock

import "time"

// boot is Go's monotonic clock where there is no CLOCK_BOOTTIME: a suspended machine's sleep
// is not counted.
func boot() time.Duration {
	return monotonic()
}
