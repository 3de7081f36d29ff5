#!/usr/bin/env bash
# The supervisor's whole loop with wb: dispatch -> follow -> diff -> continue or accept -> prune.
#
# Run it in a directory holding task.md (the task), follow-up.md (what to ask when the work
# lacks a test) and checkout/ (your own clone of the repository). Each run keeps what it
# produced in its own run-<time>/: the patches, and the accepted ones staged in worktrees of
# checkout/ (run-<time>/accepted-<machine>/). It can be run again at once: its worktree
# names are its own, and step 6 removes old runs' records, worktrees and branches.
# A machine that fails a step is named ("<machine>: not …", the reason above it on stderr) and
# the loop goes on with the others; it exits 0 once it has gone through them all.
# The judgement here is deliberately simple (did the change add a file under tests/?); wb
# reports facts and never judges, so this is where your own review goes.
set -euo pipefail
machines=(${MACHINES:-gpu-box build-1})
run=run-$(date -u +%Y%m%d-%H%M%S)-$$
mkdir "$run"
# Fields of the JSON document wb printed, joined by ":"; nothing (exit 1) when wb printed
# none: it has already said why on stderr.
get() { python3 -c 'import json,sys
try: doc = json.load(sys.stdin)
except ValueError: sys.exit(1)
print(":".join(str(doc[key]) for key in sys.argv[1:]))' "$@"; }
state_of() { wb agent status "$1" --json | get state; }

# 1. Dispatch: one task per machine, each in a new worktree of this run; keep the references.
declare -A refs
dispatched=()
for machine in "${machines[@]}"; do
  worktree=fix-$machine-${run#run-}
  if refs[$machine]=$(wb agent dispatch --to "$machine" --repo acme/widget --new-worktree "$worktree" \
                        --profile fast --task-file task.md --json | get machine agent_id); then
    dispatched+=("$machine")
  else
    echo "$machine: not dispatched (the reason is above)"
  fi
done

for machine in "${dispatched[@]}"; do
  ref=${refs[$machine]}
  # 2. Follow: the worker's actions as they happen; returns when the run ends (state last).
  wb agent logs "$ref" --follow | sed "s/^/[$machine] /" || true
  [ "$(state_of "$ref")" = completed ] || { echo "$machine: $ref did not complete; not accepted"; continue; }
  # 3. Diff: the whole change (new and binary files included), made without touching the worktree.
  wb agent diff "$ref" > "$run/$machine.patch"
  # 4. Continue when the work is not done yet: the same agent, its session and worktree kept.
  if ! grep -q '^+++ b/tests/' "$run/$machine.patch"; then
    ref=$(wb agent continue "$ref" --task-file follow-up.md --json | get machine agent_id) \
      || { echo "$machine: not continued (the reason is above); not accepted"; continue; }
    wb agent logs "$ref" --follow | sed "s/^/[$machine] /" || true
    [ "$(state_of "$ref")" = completed ] || { echo "$machine: $ref did not complete; not accepted"; continue; }
    wb agent diff "$ref" > "$run/$machine.patch"  # still against the first run's base: the whole change
  fi
  # 5. Accept: the patch is staged in a worktree of your own checkout, one per machine, for you
  #    to review and commit (wb itself never commits or pushes).
  wb agent diff "$ref" --stat | tail -n 1 | sed "s/^/$machine: accepted $ref: /"
  git -C checkout worktree add -q --detach "$PWD/$run/accepted-$machine"
  git -C "$run/accepted-$machine" apply --index "$PWD/$run/$machine.patch"
done

# 6. Prune: forget old runs everywhere, with their worktrees and wb/<name> branches (never a
#    live run's, never one a kept record still uses). A machine that cannot be reached now keeps
#    its old runs until a later run prunes them; wb names it in a `warning: <machine> …` line.
pruned=0
wb agent prune --older-than "${PRUNE_AFTER:-168h}" --all --worktrees 2> "$run/prune.err" || pruned=$?
cat "$run/prune.err" >&2
if [ "$pruned" -eq 1 ]; then  # 1: pruned where it could; each machine it could not is a warning
  sed -n 's/^warning: \([A-Za-z0-9._-]*\).*/\1: not pruned (the reason is above); the next run prunes it/p' \
    "$run/prune.err" | sort -u
elif [ "$pruned" -ne 0 ]; then
  exit "$pruned"
fi
