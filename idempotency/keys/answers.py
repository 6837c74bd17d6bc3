"""Answers as stored and replayed: rendered once to JSON text, kept byte for byte."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rest_framework.utils.encoders import JSONEncoder

from core.errors import ApplicationError
from core.problems import PROBLEM_CONTENT_TYPE, exception_to_problem

from ..models import IdempotencyKey

JSON_CONTENT_TYPE = "application/json"


@dataclass(frozen=True)
class Answer:
    """A response as stored: status, the exact body text, the headers that matter."""

    status: int
    body: str | None
    headers: dict[str, str] = field(default_factory=dict)

    def json(self) -> Any:
        return None if self.body is None else json.loads(self.body)


def _render(body: Any) -> str | None:
    if body is None:
        return None
    return json.dumps(body, cls=JSONEncoder, ensure_ascii=False, separators=(",", ":"))


def answer_new(
    *,
    status: int,
    body: Any = None,
    headers: Mapping[str, str] | None = None,
    content_type: str = JSON_CONTENT_TYPE,
) -> Answer:
    """Build an answer; `body` is rendered once to JSON text so replays are identical."""
    stored = dict(headers or {})
    if body is not None:
        stored["Content-Type"] = content_type
    return Answer(status=status, body=_render(body), headers=stored)


def answer_for_problem(exc: ApplicationError) -> Answer:
    """Build the answer for a refusal exactly as the problem handler would render it."""
    mapped = exception_to_problem(exc)
    assert mapped is not None
    body, status, headers = mapped
    return answer_new(status=status, body=body, headers=headers, content_type=PROBLEM_CONTENT_TYPE)


def _stored_answer(row: IdempotencyKey) -> Answer:
    assert row.response_status is not None  # only a finished row is replayed
    return Answer(
        status=row.response_status, body=row.response_body, headers=dict(row.response_headers)
    )
