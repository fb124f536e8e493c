# leasehold_holding: succeeds while the hold file says this pod holds the lock, and sets
# LEASEHOLD_TOKEN to the hold's fencing token. POSIX sh (busybox, dash, bash).
#
# The sidecar keeps validUntilBoottimeMs in the file: until when the hold is valid, in
# milliseconds on the clock /proc/uptime shows (CLOCK_BOOTTIME, the same kernel clock in
# every container of the pod). A file that nobody refreshes — its sidecar died or froze —
# stops vouching by itself at that deadline, before the lock can be granted elsewhere.
# Check before every action, and finish each action well within the deadline (or present
# the token to what you write, which is safe at any speed).
leasehold_holding() {
  _lh_hold=$(cat "${LEASEHOLD_HOLD_FILE:-/var/run/leasehold/hold.json}" 2>/dev/null) || return 1
  _lh_until=$(printf '%s\n' "$_lh_hold" | sed -n 's/.*"validUntilBoottimeMs":\([0-9][0-9]*\).*/\1/p')
  LEASEHOLD_TOKEN=$(printf '%s\n' "$_lh_hold" | sed -n 's/.*"fencingToken":\([0-9][0-9]*\).*/\1/p')
  read -r _lh_now _lh_idle < /proc/uptime
  # "12345.67" seconds (always two decimals) -> 12345670 ms
  _lh_now=$(printf '%s' "$_lh_now" | tr -d .)0
  [ -n "$_lh_until" ] && [ "$_lh_now" -lt "$_lh_until" ]
}
