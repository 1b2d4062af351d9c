#!/usr/bin/env bash
# A client in its own IPC, PID and mount namespaces, as in a pod without hostIPC or hostPID,
# works through the daemon: it sees the daemon's runtime directory only through a read-only
# bind mount (the daemon's real directory is hidden under an empty tmpfs), has a private, empty
# /dev/shm, and the run leaves that /dev/shm empty (the transport is memfds passed over the
# socket, never a shared /dev/shm). As root, a second client runs as uid 65534 (a pod's uid
# other than the daemon's; mpsshimd --multiuser). Root runs plain `unshare`; anyone else needs
# unprivileged user namespaces (`unshare -r`, and then no other uid); without either the test
# is skipped (77).
set -u
for variable in MPSSHIMD MPSSHIMCTL MPSSHIM_SERVER MPSSHIM_TESTDRIVER LIBMPSSHIM E2E_CLIENT; do
  if [ -z "${!variable:-}" ]; then echo "FAIL: $variable is not set (run through meson test)"; exit 1; fi
done
if ! command -v unshare >/dev/null; then echo "SKIP: no unshare(1)"; exit 77; fi
namespaces=(--ipc --pid --mount --fork)
other_uid=0
if unshare "${namespaces[@]}" true 2>/dev/null; then
  prefix=(unshare "${namespaces[@]}")
  if [ "$(id -u)" -eq 0 ] && command -v setpriv >/dev/null; then other_uid=1; fi
elif unshare -r "${namespaces[@]}" true 2>/dev/null; then
  prefix=(unshare -r "${namespaces[@]}")
else
  echo "SKIP: cannot create IPC, PID and mount namespaces here (not root, and unprivileged" \
       "user namespaces are off: kernel.unprivileged_userns_clone / user.max_user_namespaces)"
  exit 77
fi

work=$(mktemp -d /tmp/mpsshim-ns-XXXXXX)
view=$(mktemp -d /tmp/mpsshim-ns-view-XXXXXX)
chmod 755 "$view"  # the other uid's client passes through it
cleanup() {
  "$MPSSHIMCTL" --runtime-dir "$work/run" quit >/dev/null 2>&1
  sleep 0.5
  rm -rf "$work" "$view"
}
trap cleanup EXIT

if ! "$MPSSHIMD" -d --multiuser --runtime-dir "$work/run" --server "$MPSSHIM_SERVER" \
     --driver "$MPSSHIM_TESTDRIVER" --log-file "$work/daemon.log"; then
  echo "FAIL: mpsshimd did not start"; cat "$work/daemon.log"; exit 1
fi

# Inside: bind the runtime directory read-only at $view, hide $work (the daemon's real
# directory) and /dev/shm under empty tmpfs, run the client, then list /dev/shm.
inner='
set -e
mount --bind "$1/run" "$2"
mount -o remount,bind,ro "$2" 2>/dev/null || true
mount -t tmpfs tmpfs "$1"
mount -t tmpfs -o size=1m tmpfs /dev/shm
test ! -e "$1/run/control"
echo "pid in namespace: $$"
CUDA_MPS_PIPE_DIRECTORY="$2" LD_PRELOAD="$3" "$4" basic 65536
if [ "$5" = 1 ]; then
  echo "as uid 65534:"
  setpriv --reuid=65534 --regid=65534 --clear-groups \
    env CUDA_MPS_PIPE_DIRECTORY="$2" LD_PRELOAD="$3" "$4" basic 4096
fi
echo "shm entries after: $(ls -A /dev/shm | wc -l)"
'
output=$("${prefix[@]}" sh -c "$inner" sh "$work" "$view" "$LIBMPSSHIM" "$E2E_CLIENT" \
         "$other_uid" 2>&1)
status=$?
echo "$output"
fail() { echo "FAIL: $1"; echo "--- daemon log"; cat "$work/daemon.log"; exit 1; }
[ $status -eq 0 ] || fail "the namespaced client exited with $status"
grep -q "^PASS" <<<"$output" || fail "the client did not pass"
grep -q "pid in namespace: 1$" <<<"$output" || fail "the client was not in its own PID namespace"
grep -q "shm entries after: 0" <<<"$output" || fail "something was created in /dev/shm"
grep -q "attached to GPU 0" "$work/daemon.log" || fail "the daemon did not log the attach"
if [ "$other_uid" = 1 ]; then
  grep -q "PASS basic n=4096" <<<"$output" || fail "the client of uid 65534 did not pass"
  grep -q "uid 65534) attached to GPU 0" "$work/daemon.log" ||
    fail "the daemon did not serve uid 65534"
else
  echo "note: no client of another uid (needs root and setpriv)"
fi
echo "PASS: a client in its own IPC, PID and mount namespaces worked through the daemon"
