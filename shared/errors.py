"""The one exception hierarchy of retrace.

    RetraceError
    ├── ConfigError            bad or missing setting; names the key (permanent, at start)
    ├── PermanentError         retrying cannot help: the message is dead-lettered at once
    │   ├── ContractError      a bus payload or subject that does not match its contract
    │   ├── UnscopedQueryError a query on tenant-owned rows without a tenant scope
    │   └── CrossTenantError   a write that would touch another tenant's rows
    ├── RetryableError         transient: the message is redelivered with backoff
    ├── Cancelled              a person cancelled the work (`retrace cancel`): acked, dropped
    └── EmbeddedServerError    an embedded NATS or Postgres would not start

Handlers raise PermanentError for bad input and let transient failures (timeouts, lost
connections) surface as RetryableError or any other exception: the runtime retries those up to
`max_deliver` times, then dead-letters them.
"""

from __future__ import annotations

import msgspec

UNDECODABLE = (msgspec.DecodeError, UnicodeDecodeError, RecursionError)
"""What decoding JSON from outside can raise: msgspec's DecodeError for malformed JSON and its
ValidationError (a DecodeError) for the wrong shape, but UnicodeDecodeError for a string that
is not UTF-8 and RecursionError for nesting deeper than it follows. Catch all three wherever
bytes from a client, a file, a bus message or a model are decoded."""


class RetraceError(Exception):
    """Base of every error retrace raises on purpose."""


class ConfigError(RetraceError):
    """A setting is missing or malformed; the message names the environment variable."""


class PermanentError(RetraceError):
    """Retrying the same input cannot succeed."""


class ContractError(PermanentError):
    """A message does not match its contract (bad JSON, wrong fields, unknown subject)."""


class UnscopedQueryError(PermanentError):
    """A query touched tenant-owned rows from a session that has no tenant scope."""


class CrossTenantError(PermanentError):
    """A write would create or change a row that belongs to another tenant."""


class RetryableError(RetraceError):
    """A transient failure; the same input may succeed later."""


class Cancelled(RetraceError):
    """The work was cancelled (`retrace cancel`, or its cycle ended): the handler stops, the
    message is acknowledged and nothing is retried or dead-lettered."""


class EmbeddedServerError(RetraceError):
    """An embedded NATS or Postgres server could not be started or reached."""
