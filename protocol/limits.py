"""Every bound of docs/protocol.md#bounds, in one place, named; with them the other numbers more than
one module writes (exit codes, defaults, units), so each is written once (tests/unit/test_one_home_per_fact.py)."""

SCHEMA_VERSION = 1

# Exit codes of docs/cli.md#exit-codes that several modules write: here, not in courier/errors.py, because
# the thin client (courier/channels/courier_frames.py) and the printed documents (protocol/documents.py)
# need them too and import nothing of the courier's. courier/errors.py gives each error class its code.
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # Ctrl-C: 128 + SIGINT, what a shell reports
EXIT_STDOUT_CLOSED = 141  # the reader left: 128 + SIGPIPE
# The machine could not be asked or its answer not trusted; also a command whose courier went away
# under it, outcome unknown (docs/courier.md).
EXIT_TRANSPORT = 255

KIB = 1024
MIB = 1024 * KIB

TASK_MAX_BYTES = 1 * MIB
REQUEST_MAX_BYTES = 8 * MIB
REPLY_STDOUT_MAX_BYTES = 4 * MIB
REPLY_STDERR_MAX_BYTES = 64 * KIB
REMOTE_TRANSCRIPT_MAX_BYTES = 2 * MIB
EVENTS_STORED_MAX_BYTES = 128 * MIB
EVENT_LINE_MAX_BYTES = 8 * MIB
FINAL_MESSAGE_MAX_BYTES = 4096
CHANGED_FILES_MAX = 50
# A profile name in a dispatch or continue request: printable, at most this many characters.
PROFILE_NAME_MAX_CHARS = 128
LOG_ACTION_MAX_BYTES = 240
REMOTE_STDERR_EXCERPT_MAX_BYTES = 1024
REMOTE_FAILURE_SHOWN_MAX_BYTES = 4096
CREDENTIAL_FILE_MAX_BYTES = 64 * KIB
# The failure text a harness reports for a run (its own error message), cut to this many bytes.
RUN_FAILURE_MESSAGE_MAX_BYTES = 4096
# A run's small private notes (the stop request, the owner's error) are read up to this size.
RUN_NOTE_MAX_BYTES = 64 * KIB
# A Result's `failure` text on the wire, in characters.
RESULT_FAILURE_MAX_CHARS = 64 * KIB
# A path on the wire (a worktree, a diff's file), in characters: Linux's PATH_MAX.
PATH_TEXT_MAX_CHARS = 4096

# How much one read takes from a file, a pipe or a socket; SSH channels read in smaller steps.
READ_CHUNK_BYTES = 1 * MIB
SSH_READ_CHUNK_BYTES = 64 * KIB
# A shorter credential is unusable: masking it would rewrite ordinary text of the transcript.
CREDENTIAL_MIN_BYTES = 8
# A profile's on_usage_limit.prompt, the follow-up that resumes a run after a wait.
USAGE_WAIT_PROMPT_MAX_BYTES = 64 * KIB
USAGE_WAIT_PROMPT_MAX_TEXT = f"{USAGE_WAIT_PROMPT_MAX_BYTES // KIB} KiB"
# The metering relay reads a provider's response in steps of this size.
RELAY_READ_CHUNK_BYTES = 64 * KIB
# One model request's (or response's) HTTP body, read whole by the metering relay and the demo's
# model servers (courier/http_body.py): a whole conversation fits; past it, refused, not buffered.
HTTP_BODY_MAX_BYTES = 64 * MIB
# One frame on the courier's socket (courier/channels/courier_frames.py): above any request
# (REQUEST_MAX_BYTES) or reply (REPLY_STDOUT_MAX_BYTES + REPLY_STDERR_MAX_BYTES) plus an environment.
COURIER_FRAME_MAX_BYTES = 64 * MIB
# A harness's own JSON file is redacted on its decoded strings up to this size (docs/cli.md#credentials).
REDACTED_JSON_MAX_BYTES = 64 * MIB

MS_PER_SECOND = 1000
MS_PER_MINUTE = 60 * MS_PER_SECOND
MS_PER_HOUR = 60 * MS_PER_MINUTE

TIMEOUT_DEFAULT_MS = 30 * MS_PER_MINUTE
TIMEOUT_MAX_MS = 168 * MS_PER_HOUR
AWAIT_DEFAULT_MS = 1 * MS_PER_HOUR
# MCP `await` (docs/mcp.md): below the 60 s request timeout common MCP clients apply.
MCP_AWAIT_DEFAULT_MS = 45 * MS_PER_SECOND
# ... and at most this long: `0` (no bound) or a longer wait_timeout is taken as this.
MCP_AWAIT_MAX_MS = 50 * MS_PER_SECOND
# `wb mcp`: threads for the tools' blocking steps (a waiting `await` holds none between polls).
MCP_BLOCKING_THREADS = 16
AWAIT_CHUNK_MS = 5 * MS_PER_MINUTE
REMOTE_CALL_MAX_MS = 10 * MS_PER_MINUTE
# A remote await call may outlast its chunk by this much (connect, receiver start, reply).
AWAIT_CALL_SLACK_MS = 5 * MS_PER_SECOND
# A peer that answers an await chunk with `running` long before the chunk's end does not wait
# (an older or a faulty wb): it is asked again after a pause that doubles from the first to the
# last value, so a finished run is noticed at most AWAIT_REASK_MAX_S late.
AWAIT_REASK_FIRST_S = 0.5
AWAIT_REASK_MAX_S = 4.0

# A profile's on_usage_limit (docs/cli.md#waiting-out-a-usage-limit): its defaults and bound, the same in
# wb.yaml (courier/config.py) and in the run record (protocol/models.py UsageLimitPolicy).
USAGE_WAITS_DEFAULT = 3
USAGE_WAITS_MAX = 1000  # max_waits at most this, so a run's `waits` list holds at most this many
USAGE_WAIT_MAX_DEFAULT_MS = 6 * MS_PER_HOUR  # max_wait
USAGE_WAIT_PROMPT_DEFAULT = "Continue the task."
# A Result's harness_diagnostics on the wire: at most this many lines.
HARNESS_DIAGNOSTICS_MAX = 1000

FLEET_MAX_IN_FLIGHT = 32

# The courier (docs/courier.md): idle lifetime and channels per SSH connection (sshd's MaxSessions is 10).
COURIER_IDLE_DEFAULT_MS = 10 * MS_PER_MINUTE
COURIER_MAX_SESSIONS_DEFAULT = 8
COURIER_MAX_SESSIONS_MAX = 1024
# One call to one machine by status, list, logs, stop, prune and machines (diff, dispatch and
# continue keep REMOTE_CALL_MAX_MS: a large repository can take that long).
MACHINE_TIMEOUT_DEFAULT_MS = 60 * MS_PER_SECOND

LOGS_TAIL_DEFAULT = 8
ADMISSION_GRACE_S = 60.0
STOP_GRACE_S = 3.0
# How long stop waits for an owner that is recording the terminal state (it holds the run's lock).
RUN_LOCK_WAIT_S = 40.0
TIMEOUT_KILL_GRACE_S = 0.25
# The owner's terminal save: this many tries, pausing 1 s, 2 s, 4 s, 8 s between them (15 s in all).
TERMINAL_SAVE_TRIES = 5
TERMINAL_SAVE_FIRST_PAUSE_S = 1.0
AWAIT_POLL_S = 0.05

# The supervisor's loop (docs/cli.md#the-supervisors-loop).
STALL_AFTER_DEFAULT_MS = 10 * MS_PER_MINUTE
DIFF_PATCH_WIRE_MAX_BYTES = 2 * MIB
FOLLOW_WAIT_MAX_MS = AWAIT_CHUNK_MS
FOLLOW_RETRIES = 5
# One follow reply carries at most this many actions (each at most LOG_ACTION_MAX_BYTES).
FOLLOW_ACTIONS_PER_REPLY_MAX = 4096
# `wb agent watch` (docs/cli.md, wb agent watch; docs/protocol.md, watch): one pending call per machine.
# The receiver looks at the records this often while it waits (a stat per live run, a stat of the store).
WATCH_POLL_S = 0.25
# One watch call waits at most this long for a change (at most FOLLOW_WAIT_MAX_MS).
WATCH_WAIT_DEFAULT_MS = 30 * MS_PER_SECOND
# The cursor a watch reply carries and the next request echoes.
WATCH_CURSOR_MAX_BYTES = 1 * MIB
# A run dispatched and ended between two watch calls is reported when it started at most this
# long before the earlier call's scan (its record is written right after its start is stamped).
WATCH_UNSEEN_SLACK_S = 120.0
# A machine that does not answer is asked again after 1 s, 2 s, 4 s, … at most 30 s.
WATCH_RETRY_FIRST_S = 1.0
WATCH_RETRY_MAX_S = 30.0
# dispatch --to auto --wait-for-slot (docs/cli.md#placement-across-a-fleet): placement is tried again when a
# candidate's run finishes, and at least this often otherwise, but never twice within SLOT_RETRY_MIN_S.
SLOT_RECHECK_S = 5.0
SLOT_RETRY_MIN_S = 1.0
# The MCP watch tool's cursor remembers at most this many ended runs per machine (not to report them twice).
WATCH_ENDED_KEPT = 1200
# `watch --exec`: CMD runs at most this long (`--exec-timeout`); past it, its process group is killed.
WATCH_EXEC_TIMEOUT_DEFAULT_MS = 60 * MS_PER_SECOND
# A killed CMD not reaped within this long is left behind (reported), never waited on further.
WATCH_EXEC_REAP_S = 5.0
# An older peer without the `watch` capability: its `list` is polled this often instead.
WATCH_LIST_POLL_S = 1.0
# A byte offset on the wire (`follow_from`): what a signed 64-bit file offset can hold.
BYTE_OFFSET_MAX = 2**63 - 1

SSH_CONNECT_TIMEOUT_S = 10.0
SSH_KEEPALIVE_INTERVAL_S = 15.0
SSH_KEEPALIVE_COUNT_MAX = 3
# Sessions run at once over one shared connection: below OpenSSH's default MaxSessions (10).
SSH_CHANNELS_PER_CONNECTION_MAX = 8
CLOCK_OFFSET_WARN_MS = 5000
# `machines --check` text: an offset within the round trip plus this much is below what one
# `version` call can tell (the peer stamps `now` somewhere inside the round trip, after its start-up), shown `ok`.
CLOCK_OFFSET_RESOLUTION_S = 1.0

# Hostile-reply containment: a reply nested deeper than this is refused
# before the JSON decoder can recurse into it.
REPLY_MAX_NESTING = 64
# A valid result encodes to at least about 250 bytes, so a 4 MiB reply holds fewer than
# 17,000: a list reply with more results (or warnings) is refused before any model is built.
REPLY_RESULTS_MAX = 20_000
# JSON objects and arrays in one reply (a result has at most seven), counted before decoding,
# so a reply of a million tiny `{}` never becomes a million Python objects.
REPLY_CONTAINERS_MAX = 8 * REPLY_RESULTS_MAX
# JSON values in one reply, scalars included, counted before decoding: a real result spends
# at least about 23 bytes per value, so a 4 MiB reply of real results holds fewer than this,
# and a reply of millions of tiny numbers or strings never becomes millions of Python objects.
REPLY_VALUES_MAX = 200_000

# The version reply's `capabilities` (docs/protocol.md#optional-features): how many a reply may list.
CAPABILITIES_MAX = 64
# A `command` profile (docs/harnesses.md): at most this many argv items, each at most this many bytes.
COMMAND_ARGS_MAX = 64
# A profile's `network: [HOST[:PORT], …]` list (docs/security.md#confined-runs).
NETWORK_HOSTS_MAX = 64
SLOTS_MAX = 10_000  # a target's `slots` (docs/config.md#targets)
PLACEMENT_TIMEOUT_DEFAULT_MS = 30 * MS_PER_SECOND  # dispatch --to auto's --machine-timeout (docs/cli.md)
COMMAND_ARG_MAX_BYTES = 4 * KIB
# A provider's base_url, credential_env and credential_file in a run record (protocol/models.py RoutingText),
# and a base_url in wb.yaml (ASCII there, so as many bytes): at most this.
PROVIDER_ROUTING_MAX_CHARS = 2048
# A cost budget, in dollars (docs/cli.md#budgets): --max-cost-usd and a profile's budget.cost_usd, at most this.
COST_USD_MAX = 1_000_000
# A price rate (docs/config.md#price), dollars per million tokens: at most this in wb.yaml and on the wire.
PRICE_USD_PER_MTOK_MAX = 1_000_000
TOKENS_PER_MTOK = 1_000_000  # the unit of a price rate
# A profile's Ray resources (docs/ray.md): cpus, gpus and each custom amount, at most this.
RESOURCE_AMOUNT_MAX = 1_000_000

# The bounds as messages and tool descriptions write them.
TASK_MAX_TEXT = f"{TASK_MAX_BYTES // MIB} MiB"
TIMEOUT_MAX_TEXT = f"{TIMEOUT_MAX_MS // MS_PER_HOUR}h"
FOLLOW_WAIT_MAX_TEXT = f"{FOLLOW_WAIT_MAX_MS // MS_PER_MINUTE} min"

# The owner's HTTP(S) proxy for a profile's `network: [HOST[:PORT], ...]` (courier/runs/connect_proxy.py).
PROXY_HEADER_MAX_BYTES = 64 * KIB  # one request's (or an upstream response's) whole header block
PROXY_HEADER_LINES_MAX = 100
PROXY_HEADER_WAIT_S = 30.0  # a client that sends no complete header block by then is dropped
PROXY_CONNECT_TIMEOUT_S = 10.0  # reaching an allowed host
PROXY_CONNECTIONS_MAX = 100  # open client connections at once; past it, 503
PROXY_READ_CHUNK_BYTES = 64 * KIB
# Entries of /tmp (and of each directory directly in it) a confined run looks at for Unix sockets to hide
# (courier/runs/sandbox.py): enough for a busy /tmp, bounded so a flooded one costs a run nothing much.
SANDBOX_TMP_SCAN_ENTRIES = 4096
# A confined run's own branch, carried back from its private copy by the owner (courier/runs/own_branch.py).
BRANCH_SYNC_INTERVAL_S = 1.0  # while the run goes on, at most this often (and only when the copy changed)
BRANCH_LOCK_PATIENCE_S = 1.0  # at the worker's end, how long another git process's `<ref>.lock` is waited for
BRANCH_LOCK_RETRY_S = 0.02  # how often a held lock is tried again meanwhile
BRANCH_REFLOG_CARRY_MAX_BYTES = 1 * MIB  # new reflog lines carried by one sync
# HEAD read from git's files (courier/runs/git_head.py): larger files are left to git itself.
GIT_REF_FILE_MAX_BYTES = 4096  # HEAD, a loose ref, a `gitdir:` or `commondir` file
GIT_PACKED_REFS_MAX_BYTES = 16 * MIB
