"""Request keys: claim, match, atomic phases, finish, takeover, the completer and the purge.

The design (docs/idempotency.md) in short:

- A request first reads its (owner, key) row: a finished key is replayed
  from that one indexed read. An existing row is matched: another request
  (422), a stored answer (replay), a live lease (409), or an expired lease /
  open key (taken over with a conditional UPDATE and a fresh fencing token).
- A fresh key is claimed by INSERTing its row, with a fresh fencing token in
  `leased_by`, as the first statement of the operation's first phase, under
  `ON CONFLICT ON CONSTRAINT <the (owner, key) unique constraint> DO NOTHING`:
  exactly that constraint decides who runs; the loser rolls back before any
  effect and is answered from the winner's row (409 / replay / 422).
- An operation runs in phases. Each phase is one transaction that commits the
  phase's effects together with the key's next `recovery_point` and `data`,
  through `UPDATE ... WHERE leased_by = <my token>`: a request whose lease was
  taken over cannot commit anything.
- The final answer is stored in the same transaction as the effect that
  decided it (the last phase) and replayed byte for byte.
- Lease ages are judged by the database clock (`now()`), never the process's.

The package, one job a module (each imports only those above it):

- `errors`: the key's refusals (400/409/422 problems), KeyLeaseLost, KeyClaimLost.
- `fingerprint`: the key's header value and the body's fingerprint.
- `answers`: answers as stored and replayed.
- `clock`: lease ages by the database clock.
- `run`: KeyRun, the fenced atomic phases (the first phase of a fresh key
  executes the key's claim, handed over by `claim`).
- `claim`: claim (KeyClaim, the key's INSERT), match, takeover, and closing a
  failed run.
- `operations`: results, the caller's presenter, the one-phase block
  (`keyed_phase`) and the one registry of declared operations.
- `completer`: keys abandoned mid-way, driven to their end.
- `purge`: finished keys past their retention, deleted.
"""

from ..models import FINISHED, STARTED
from .answers import JSON_CONTENT_TYPE, Answer, answer_for_problem, answer_new
from .claim import (
    LOCK_NOT_AVAILABLE,
    OWNER_KEY_CONSTRAINT,
    UNSTORED_STATUSES,
    KeyClaim,
    key_answer_existing,
    key_claim,
    key_lookup,
    key_run_failed,
    key_stored_answer,
)
from .completer import keys_complete_abandoned
from .errors import (
    IdempotencyKeyInUse,
    IdempotencyKeyInvalid,
    IdempotencyKeyMissing,
    IdempotencyKeyReused,
    KeyClaimLost,
    KeyLeaseLost,
)
from .fingerprint import MAX_KEY_LENGTH, body_fingerprint, canonical_json, key_validate
from .operations import (
    KeyedOperation,
    Presenter,
    Reply,
    Result,
    Resume,
    close_run,
    keyed_operation,
    keyed_phase,
    refusals_presented,
    registered_operations,
    registered_presenter,
    single_phase_resume,
)
from .purge import keys_purge, keys_purge_capacity
from .run import KeyRun

__all__ = [
    "FINISHED",
    "STARTED",
    "JSON_CONTENT_TYPE",
    "LOCK_NOT_AVAILABLE",
    "MAX_KEY_LENGTH",
    "OWNER_KEY_CONSTRAINT",
    "UNSTORED_STATUSES",
    "Answer",
    "IdempotencyKeyInUse",
    "IdempotencyKeyInvalid",
    "IdempotencyKeyMissing",
    "IdempotencyKeyReused",
    "KeyClaimLost",
    "KeyClaim",
    "KeyLeaseLost",
    "KeyRun",
    "KeyedOperation",
    "Presenter",
    "Reply",
    "Result",
    "Resume",
    "answer_for_problem",
    "answer_new",
    "body_fingerprint",
    "canonical_json",
    "close_run",
    "key_answer_existing",
    "key_claim",
    "key_lookup",
    "key_run_failed",
    "key_stored_answer",
    "key_validate",
    "keys_complete_abandoned",
    "keys_purge",
    "keys_purge_capacity",
    "keyed_operation",
    "keyed_phase",
    "refusals_presented",
    "registered_operations",
    "registered_presenter",
    "single_phase_resume",
]
