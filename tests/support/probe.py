"""The probe: a test-only keyed operation with two phases around one outside call.

It exists to exercise the request-key machinery before any domain operation
does (tests, the chaos run and the benchmark), mounted only when
`SHOP_TEST_ENDPOINTS` is true. Its shape is the one every real operation has:

    started --phase 1: insert a ProbeRecord-->  recorded
            --call the stub service (no transaction open), by a reference
              derived from the record, so a repeated call is one effect-->
            --phase 2: complete the record + outbox row + final answer--> finished
      (or, when the stub says "pending": phase 2 marks it pending and
       leave_open(202); a retry resumes at "pending" and asks again)

Failpoints (besides the ones every phase has, `probe.run.<point>.before_commit`
and `.after_commit`): `probe.run.after_call` between the call and phase 2.
"""

from __future__ import annotations

import requests
from django.conf import settings
from django.db import transaction

from core.errors import ApplicationError
from idempotency.failpoints import failpoint
from idempotency.keys import KeyRun, Presenter, Reply, Result, keyed_operation
from idempotency.messaging.outbox import outbox_write
from idempotency.models import STARTED

from .models import ProbeRecord

OPERATION = "probe.run"
RECORDED = "recorded"
PENDING = "pending"


class ProbeRefused(ApplicationError):
    status = 409
    code = "probe_refused"
    title = "Probe refused"


class ProbeStubUnavailable(ApplicationError):
    status = 503
    code = "probe_stub_unavailable"
    title = "Stub service unavailable"


def probe_body(record: ProbeRecord) -> dict:
    return {
        "id": str(record.id),
        "label": record.label,
        "amount": record.amount,
        "status": record.status,
        "confirmation": record.confirmation,
    }


def _stub_call(*, reference: str, amount: int) -> dict:
    """Ask the stub service to apply the effect `reference` (idempotent on its side)."""
    url = settings.SHOP_PROBE_STUB_URL
    if not url:
        return {"status": "done", "confirmation": f"local-{reference}"}
    try:
        response = requests.post(
            url.rstrip("/") + "/effects",
            json={"reference": reference, "amount": amount},
            timeout=float(settings.SHOP_PROBE_STUB_TIMEOUT),
        )
    except requests.RequestException as exc:
        raise ProbeStubUnavailable("The stub service did not answer.") from exc
    if response.status_code != 200:
        raise ProbeStubUnavailable(f"The stub service answered {response.status_code}.")
    return response.json()


def probe_run(
    *, run: KeyRun, owner_id: int, label: str, amount: int, answer_as: str = "json"
) -> ProbeRecord:
    """Record a probe, have the stub apply its effect, complete it; resume where `run` stopped.

    `answer_as="redirect"` (form submissions) answers 303 to the probe's page
    instead of its JSON body; it is kept in the run's data, so a resumed run
    (a retry or the completer) answers the same way.
    """
    if run.recovery_point == STARTED:
        if label == "refuse":
            raise ProbeRefused("The probe refuses the label 'refuse'.")
        with run.phase(next_point=RECORDED) as data:
            record = ProbeRecord.objects.create(
                owner_id=owner_id, label=label, amount=amount, status=RECORDED
            )
            data["probe_id"] = str(record.id)
            data["amount"] = amount
            data["answer_as"] = answer_as
    return _probe_continue(run)


def _probe_continue(run: KeyRun) -> ProbeRecord:
    data = run.data
    probe_id = data["probe_id"]
    outcome = _stub_call(reference=f"probe-{probe_id}", amount=data["amount"])
    failpoint("probe.run.after_call")
    pending = outcome.get("status") == "pending"
    redirect = data.get("answer_as") == "redirect"
    location = {"Location": f"/_test/probe-form/{probe_id}/"}
    with run.phase(next_point=PENDING if pending else "finished"):
        record = ProbeRecord.objects.select_for_update().get(pk=probe_id)
        if pending:
            record.status = PENDING
            record.save(update_fields=["status"])
            if redirect:
                run.leave_open(status=303, headers=location)
            else:
                run.leave_open(status=202, body=probe_body(record))
        else:
            record.status = "completed"
            record.confirmation = outcome.get("confirmation", "")
            record.save(update_fields=["status", "confirmation"])
            outbox_write(
                aggregate_type="probe",
                aggregate_id=probe_id,
                event_type="probe.completed",
                payload=probe_body(record),
            )
            if redirect:
                run.finish(status=303, headers=location)
            else:
                run.finish(status=201, body=probe_body(record))
    return record


def probe_resume(run: KeyRun, present: Presenter) -> None:
    """Settle an abandoned probe key: forget it if nothing committed, else finish it.

    The probe's phases answer by themselves (`run.finish`): `present` is unused."""
    if run.recovery_point == STARTED:
        run.abandon()
        return
    _probe_continue(run)


def probe_run_unkeyed(*, owner_id: int, label: str, amount: int) -> ProbeRecord:
    """Do the probe's work without a request key (the benchmark's baseline)."""
    with transaction.atomic():
        record = ProbeRecord.objects.create(
            owner_id=owner_id, label=label, amount=amount, status=RECORDED
        )
    outcome = _stub_call(reference=f"probe-{record.id}", amount=amount)
    with transaction.atomic():
        record = ProbeRecord.objects.select_for_update().get(pk=record.pk)
        record.status = "completed"
        record.confirmation = outcome.get("confirmation", "")
        record.save(update_fields=["status", "confirmation"])
        outbox_write(
            aggregate_type="probe",
            aggregate_id=str(record.id),
            event_type="probe.completed",
            payload=probe_body(record),
        )
    return record


@keyed_operation(OPERATION, resume=probe_resume)
def answers_by_itself(result: Result) -> Reply:
    """The presenter of an operation whose runs close themselves (the probe, tests' operations)."""
    raise AssertionError("this operation's runs answer by themselves")
