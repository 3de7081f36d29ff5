#!/usr/bin/env bash
# The supervisor's whole loop with wb: dispatch -> follow -> diff -> continue or accept -> prune.
#
# Run it in a directory holding task.md (the task), follow-up.md (what to ask when the work
# lacks a test) and checkout/ (your own clone of the repository; accepted patches are staged
# in its worktrees accepted-<machine>/).
# The judgement here is deliberately simple (did the change add a file under tests/?); wb
# reports facts and never judges, so this is where your own review goes.
set -euo pipefail
machines=(${MACHINES:-gpu-box build-1})
ref_of() { python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["machine"]+":"+r["agent_id"])'; }
state_of() { wb agent status "$1" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["state"])'; }

# 1. Dispatch: one task per machine, each in its own new worktree; keep the references.
declare -A refs
for machine in "${machines[@]}"; do
  refs[$machine]=$(wb agent dispatch --to "$machine" --repo acme/widget --new-worktree "fix-$machine" \
                     --profile fast --task-file task.md --json | ref_of)
done

for machine in "${machines[@]}"; do
  ref=${refs[$machine]}
  # 2. Follow: the worker's actions as they happen; returns when the run ends (state last).
  wb agent logs "$ref" --follow | sed "s/^/[$machine] /"
  [ "$(state_of "$ref")" = completed ] || { echo "$machine: $ref did not complete; not accepted"; continue; }
  # 3. Diff: the whole change (new and binary files included), made without touching the worktree.
  wb agent diff "$ref" > "$machine.patch"
  # 4. Continue when the work is not done yet: the same agent, its session and worktree kept.
  if ! grep -q '^+++ b/tests/' "$machine.patch"; then
    ref=$(wb agent continue "$ref" --task-file follow-up.md --json | ref_of)
    wb agent logs "$ref" --follow | sed "s/^/[$machine] /"
    [ "$(state_of "$ref")" = completed ] || { echo "$machine: $ref did not complete; not accepted"; continue; }
    wb agent diff "$ref" > "$machine.patch"  # still against the first run's base: the whole change
  fi
  # 5. Accept: the patch is staged in a worktree of your own checkout, one per machine, for you
  #    to review and commit (wb itself never commits, pushes or deletes anything).
  wb agent diff "$ref" --stat | tail -n 1 | sed "s/^/$machine: accepted $ref: /"
  git -C checkout worktree add -q --detach "$PWD/accepted-$machine"
  git -C "accepted-$machine" apply --index "$PWD/$machine.patch"
done

# 6. Prune: forget old records everywhere (never worktrees or branches, never a live run).
wb agent prune --older-than "${PRUNE_AFTER:-168h}" --all
