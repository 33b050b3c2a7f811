#!/usr/bin/env bash
# A queue of GPU runs longer than one device call (10 minutes): `start` runs SCRIPT detached
# (it outlives the call while the machine stays warm), `wait` returns when it has finished or
# after SECONDS, with everything it wrote so far packed into one file (the device brings back
# eight files a call).
#
#   bash benchmark/gpu/detach.sh start DIR SCRIPT   # SCRIPT runs as `bash SCRIPT DIR`
#   bash benchmark/gpu/detach.sh wait DIR SECONDS TARBALL
set -uo pipefail
cmd=${1:?usage: detach.sh start DIR SCRIPT | wait DIR SECONDS TARBALL}
dir=${2:?DIR}
case "$cmd" in
  start)
    script=${3:?SCRIPT}
    mkdir -p "$dir"; rm -f "$dir/done"
    : > "$dir/queue.log"  # now, so that a `wait` in the same call finds the queue at once
    setsid nohup bash -c "bash '$script' '$dir' >> '$dir/queue.log' 2>&1; echo \$? > '$dir/done'" \
      > /dev/null 2>&1 < /dev/null &
    echo "started $script into $dir" ;;
  wait)
    secs=${3:?SECONDS}; tarball=${4:?TARBALL}
    # a machine handed back between calls comes back fresh, without the queue: say so at once
    # rather than wait out SECONDS of device time for nothing
    if [ ! -f "$dir/queue.log" ]; then echo "no queue in $dir: this machine is not the one it started on"; exit 3; fi
    end=$((SECONDS + secs))
    while [ ! -f "$dir/done" ] && [ $SECONDS -lt $end ]; do sleep 5; done
    if [ -f "$dir/done" ]; then echo "finished, rc $(cat "$dir/done")"; else echo "still running"; fi
    tail -5 "$dir/queue.log"
    tar -czf "$tarball" --exclude='*.tgz' -C "$(dirname "$dir")" "$(basename "$dir")" ;;
  *) echo "unknown command $cmd"; exit 2 ;;
esac
