"""What a session (session.py) needs from the data plane that runs it: the server's settings,
one narrow interface to the loop, the pool and the server (``SessionHost``, implemented by
``DataPlane``), and the check of a consumer's hello against the settings."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Protocol, TypeVar

from ..errors import install_extra
from ..pool.tasks import Task
from ..protocol import framing
from ..protocol.generated import pb
from ..protocol.version import PROTOCOL_VERSION, compatible, mismatch_message

if TYPE_CHECKING:
    from ..contract.batch_id import BatchId
    from .stats import ServerStats

# the session type a host takes back (session.Session): a parameter, so that this module need
# not import session.py, which imports it
S_contra = TypeVar("S_contra", contravariant=True)


@dataclass(frozen=True)
class SessionSettings:
    """The server's settings every session follows."""

    token: str
    server_id: str
    compression: str        # "" or the compression every batch carries
    shared_memory: bool     # offer shared memory to consumers on this host
    send_timeout_s: float
    num_batches: int        # batches per epoch of the plan


class SessionHost(Protocol[S_contra]):
    """What a session asks of the data plane that runs it (dataplane.py): the server's settings
    and stats, the worker pool's tasks, and the loop's services."""

    settings: SessionSettings
    stats: "ServerStats"

    def submit(self, task: Task) -> None: ...  # its on_result comes once, on any thread
    def cancel(self, tasks: list[Task]) -> None: ...
    def shutting_down(self) -> bool: ...  # new requests are refused (SHUTTING_DOWN)
    def count_auth_failure(self) -> None: ...
    # Each batch a consumer hints at or requests, before it is queued: the pipeline's block
    # prefetcher, if any, fetches its blocks once per block and epoch (block_prefetch.PrefetchOnce).
    def prefetch(self, batch: BatchId) -> None: ...

    def call_soon(self, fn: Callable, *args) -> None: ...  # from any thread: fn(*args) on the loop's
    def closed(self, session: S_contra) -> None: ...  # the loop forgets the session
    def want_write(self, session: S_contra, on: bool) -> None: ...  # (un)watch its socket for writability
    def flush_later(self, session: S_contra) -> None: ...  # session.flush() at the end of the loop's turn


def hello_refusal(hello: pb.BulkHello, settings: SessionSettings, nonce: bytes) -> tuple[pb.ErrorKind, str] | None:
    """Why a consumer's hello is refused, as (error kind, message); None when it is welcome."""
    if not compatible(hello.client_version, PROTOCOL_VERSION):
        return pb.VERSION_MISMATCH, mismatch_message(hello.client_version, PROTOCOL_VERSION)
    if not framing.hmac.compare_digest(hello.proof, framing.token_proof(settings.token, nonce)):
        return pb.PERMISSION_DENIED, "missing or wrong job token"
    if settings.compression and settings.compression not in hello.accept_compressions:
        return pb.BAD_REQUEST, (f"this server compresses batches with {settings.compression}, the client cannot "
                                f"decode it: {install_extra('compress')} on the consumer")
    return None
