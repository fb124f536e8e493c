package leasehold

import "golang.org/x/sys/unix"

// boottimeNs reads CLOCK_BOOTTIME (counts time suspended, like the sidecar's deadlines).
func boottimeNs() (int64, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return 0, err
	}
	return ts.Nano(), nil
}
