"""GPT-Live's delegation (Sans-I/O): the tasks the Live model hands off, and the Responses conversation.

The Live model (the session's engine) is offered one built-in function,
``delegate`` (``DELEGATE_TOOL``: its one argument ``task``, the task written
out whole), where its engine can call functions (``can_delegate``: the vLLM
engine, the cascade with a vLLM thinker, a remote Realtime server); an engine
that cannot never delegates. A call of it is no tool call to the Live client
(the Live spelling sends no item or response events): when the answer that
made it ends, ``Delegations.delegate`` turns it into

- ``session.delegation.created`` ``{delegation: {id, type: "delegation",
  target}, offset_ms}`` (the session timeline when the answer ended); the id
  joins ``handed``, which ``session.thinking.append`` and
  ``.commentary.append`` name as ``delegation_id`` (client delegation);
- the call's output in the Live conversation (the model reads that the task
  is handed off and that its result comes later);
- an automatic spoken acknowledgement ``acknowledgement_delay_ms`` later (0
  unless set): the model says briefly that it is working on it (``ACK_SAY``
  where its engine follows no instructions), unless thinking or commentary
  is appended first (every pending acknowledgement is then dropped), the
  answer that delegated already said something, or the model is speaking,
  the user is, or an audio fixture plays when it is due (it is dropped: late,
  it would only interrupt);
- with ``responses`` delegation, the task on the Responses backend.

**The Responses conversation** (``items``): the input items a Responses
request carries, one list per session, stateless on the backend (each
request carries them all, ``store: false``). The Live conversation's user and
assistant messages enter it (as text) before each task and each client
message, so the backend sees the dialogue in order; then the task (a user
message, as its request starts), or the client's items
(``response.item.create``: messages, ``function_call``,
``function_call_output``, which goes right after its call); then what each
response outputs (its messages and function calls). A function call the
backend made waits for its output, and is left out of every request until it
has one; ``response.create`` then continues the delegation that call belongs
to (or, answering none, is the client's own request: its events carry no
``delegation_id``). It holds at most ``MAX_BACKEND_ITEMS`` items and
``MAX_BACKEND_BYTES`` of JSON: past either, its oldest items are dropped.

**A request** (``RunResponses``, run by the host): the session's
``delegation.responses`` settings as given (model, instructions, tools,
max_output_tokens, ...), the conversation as ``input``, ``stream: true``.
One runs at a time, until its stream says its response ended (``response.completed``,
``.failed``, ``.incomplete``: what follows on that stream is ignored) or the stream fails or
closes first: the model's tasks wait their turn (at most
``MAX_QUEUED`` wait; past it, the model is told the task was not delegated,
and the client gets ``info`` ``delegation_queue_full``); a client's
``response.create`` while one runs is refused
(``conversation_already_has_active_response``). Every event of its stream goes
to the client as ``response.event`` ``{event, delegation_id}`` (lifecycle
snapshots slimmed: ``slim``). When it ends, the text of its messages is
spoken (the commentary path: ``ResponseParams.say``). A failure is an
``error`` with its code (``hosting/responses_backend.py``: unreachable, HTTP
status, timeout, invalid stream), never silence, and the model is told
(silently) that the task failed.

The Responses conversation and the request under way are in the session's
snapshot (a ``response.event`` asks for none: this part marks what changes).
On another replica (a resume after the one running it was lost), a request
under way runs again from the start, without what it had output (a new
``response.created``); acknowledgements still due are dropped.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from gateway.protocol import live_config as lc
from gateway.protocol import live_events as le
from gateway.protocol.errors import Code, ProtocolError
from gateway.session.conversation import Item
from gateway.session.effects import Cancel, RunResponses, Wake
from gateway.session.events import EventLog
from orchestrator.engine import EngineInfo

DELEGATE = "delegate"
DELEGATE_TOOL: dict[str, Any] = {
    "type": "function",
    "name": DELEGATE,
    "description": (
        "Hand a task to the backend agent, which can reason at length, look things up and use the "
        "application's tools and records. Call it whenever the user asks for something you cannot answer "
        "reliably from this conversation alone (facts you are unsure of, account or order details, "
        "calculations, actions to take), instead of answering it yourself. The result comes back into this "
        "conversation later, for you to tell the user; until then, do not guess it."
    ),
    "parameters": {
        "type": "object",
        "properties": {
            "task": {
                "type": "string",
                "description": (
                    "The task, complete and self-contained: what the user wants, with every detail from the "
                    "conversation it needs (names, numbers, dates, constraints), written so that it can be done "
                    "without hearing the conversation."
                ),
            }
        },
        "required": ["task"],
        "additionalProperties": False,
    },
}
ACK_SAY = "One moment, I am working on that."  # what an engine that follows no instructions says
ACK_INSTRUCTIONS = (
    "In one short sentence, tell the user that you are working on their request and will come back with "
    "the result. Do not answer the request itself."
)
MAX_BACKEND_ITEMS = 256  # the Responses conversation's items; more: the oldest are dropped
MAX_BACKEND_BYTES = 256 << 10  # its items' JSON (in every snapshot); more: the oldest are dropped
MAX_QUEUED = 8  # the model's tasks waiting for the request under way; more: not delegated
MAX_TASK_CHARS = 8000  # a delegate call's task; longer: not delegated (the model is told why)

RESPONSES_DELEGATION_REQUIRED = "responses_delegation_required"  # response.* without Responses delegation
RESPONSES_BACKEND_UNCONFIGURED = "responses_backend_unconfigured"  # session.start: no backend here
RESPONSES_BACKEND_UNREACHABLE = "responses_backend_unreachable"  # (also: its stream ended too soon)
DELEGATION_QUEUE_FULL = "delegation_queue_full"  # info: a task the model delegated was not
_ITEM_TYPES = ("message", "function_call", "function_call_output")
_LIFECYCLE = frozenset(
    {"response.created", "response.queued", "response.in_progress", "response.completed", "response.failed",
     "response.incomplete"}
)  # fmt: skip
_TERMINAL = frozenset({"response.completed", "response.failed", "response.incomplete"})
_WAKE_ACK = "ack:"


def can_delegate(engine: EngineInfo) -> bool:
    """Whether the engine's model can call ``delegate`` (it calls functions)."""
    return "tools" not in engine.ignored_fields


def slim(event: dict[str, Any]) -> dict[str, Any]:
    """A Responses stream event as ``response.event`` carries it: a lifecycle snapshot
    (``response.created``, ``.in_progress``, ``.completed``, ...) without its ``input`` and
    with ``instructions``, ``tools`` and ``output`` cleared (the granular events carry the
    content); every other event as it is."""
    response = event.get("response")
    if event.get("type") not in _LIFECYCLE or not isinstance(response, dict):
        return event
    slimmed = {k: v for k, v in response.items() if k != "input"}
    slimmed.update(instructions=None, tools=[], output=[])
    return {**event, "response": slimmed}


class Voice(Protocol):
    """What the Live session does for its delegations (``LiveSession``)."""

    def timeline_ms(self) -> int:
        """Now, on the session timeline."""

    def dialogue(self) -> Iterable[Item]:
        """The Live conversation, oldest first."""

    def call_output(self, call_id: str, text: str) -> None:
        """The output of the model's ``delegate`` call ``call_id``, into the Live conversation."""

    def speak(self, text: str) -> None:
        """Say ``text`` (a delegated result) as commentary is said."""

    def tell(self, text: str) -> None:
        """Silent context for the model."""

    def acknowledge(self) -> None:
        """Say a short acknowledgement now, unless something is being said or heard."""


@dataclass(slots=True)
class _Run:
    """The Responses request under way."""

    request_id: str
    delegation_id: str | None  # None: the client's own response.create
    event_id: str | None  # the response.create that asked for it
    text: list[str] = field(default_factory=list)  # its messages' text, as they finish


class Delegations:
    """See the module docstring."""

    def __init__(self, log: EventLog, voice: Voice) -> None:
        self._log = log
        self._voice = voice
        self.settings = lc.Delegation()  # the session's (set again on every update)
        self.handed: dict[str, str] = {}  # the delegations handed out: id -> target
        self.items: list[dict[str, Any]] = []  # the Responses conversation (module docstring)
        self._sizes: list[int] = []  # each item's JSON bytes
        self._made_by: list[str | None] = []  # each item's request (an output of it), or None
        self._copied: set[str] = set()  # Live conversation items already in it
        self.calls: dict[str, str | None] = {}  # the backend's function calls awaiting output: -> delegation
        self._answered: dict[str, str | None] = {}  # calls answered since the last request: -> delegation
        self.running: _Run | None = None
        self.queue: list[tuple[str, str]] = []  # the model's tasks waiting for the request under way: (id, task)
        self.pending_acks: set[str] = set()  # delegations whose acknowledgement is still due

    # --- the model delegates -----------------------------------------------------------

    def delegate(self, call_id: str, arguments: str, *, spoke: bool) -> None:
        """The model called ``delegate`` in an answer that ended (``spoke``: it said something)."""
        task = _task_of(arguments)
        if isinstance(task, Exception):
            self._voice.call_output(call_id, f"Not delegated: {task}")
            return
        if self.settings.type == "responses" and len(self.queue) >= MAX_QUEUED:
            self._voice.call_output(call_id, "Not delegated: the backend is busy with earlier tasks; tell the user "
                                    "to ask again in a moment.")  # fmt: skip
            self._log.emit("info", code=DELEGATION_QUEUE_FULL, message=f"The model delegated a task while "
                           f"{MAX_QUEUED} waited for the Responses backend; it was not delegated.")  # fmt: skip
            return
        target = self.settings.type
        delegation_id = self._log.new_id("deleg")
        self.handed[delegation_id] = target
        self._log.emit("session.delegation.created",
                       delegation={"id": delegation_id, "type": "delegation", "target": target},
                       offset_ms=self._voice.timeline_ms())  # fmt: skip
        self._voice.call_output(call_id, f"Delegated (delegation {delegation_id}). Its result will be added to "
                                "this conversation when it is ready; do not guess it.")  # fmt: skip
        if not spoke:
            self.pending_acks.add(delegation_id)
            delay_ms = self.settings.acknowledgement_delay_ms or 0
            self._log.effects.append(Wake(delay_ms / 1000, _WAKE_ACK + delegation_id))
        if target == "responses":
            if self.running is not None:
                self.queue.append((delegation_id, task))
            else:
                self._task(delegation_id, task)

    def wake(self, key: str) -> bool:
        """A ``Wake`` this part asked for (True), or not its own (False)."""
        if not key.startswith(_WAKE_ACK):
            return False
        delegation_id = key[len(_WAKE_ACK) :]
        if delegation_id in self.pending_acks:
            self.pending_acks.discard(delegation_id)
            self._voice.acknowledge()
        return True

    def appended(self) -> None:
        """Thinking or commentary was appended: every acknowledgement still due is dropped."""
        self.pending_acks.clear()

    # --- the client's Responses events -----------------------------------------------------

    def item_create(self, event: le.ResponseItemCreate) -> None:
        """``response.item.create``: ``item`` joins the Responses conversation."""
        self._need_responses("response.item.create")
        item = _checked_item(event.item)
        if item.get("type") == "function_call_output":
            call_id = item["call_id"]
            if call_id in self.calls:
                self._answered[call_id] = self.calls.pop(call_id)
            self._append(item, after=call_id)
            self._log.changed()
            return
        self._sync()
        if item.get("type") == "function_call":
            self.calls.pop(item["call_id"], None)  # (the client's own: it answers it itself)
        self._append(item)
        self._log.changed()

    def response_create(self, event: le.ResponseCreate) -> None:
        """``response.create``: a request to the backend, continuing the delegation whose function
        calls the items since the last one answered (else the client's own)."""
        self._need_responses("response.create")
        if self.running is not None:
            raise ProtocolError(Code.RESPONSE_ACTIVE, f"A Responses request is under way "
                                f"({self.running.request_id!r}); wait for its response.completed.",
                                param="type")  # fmt: skip
        owners = [d for d in self._answered.values() if d is not None]
        self._answered.clear()
        self._run(owners[-1] if owners else None, event.event_id)

    def _need_responses(self, name: str) -> None:
        if self.settings.type != "responses":
            raise ProtocolError(RESPONSES_DELEGATION_REQUIRED, f"{name} requires Responses delegation "
                                "(session delegation type 'responses').", param="type")  # fmt: skip

    # --- requests --------------------------------------------------------------------------

    def _task(self, delegation_id: str, task: str) -> None:
        """The model's task on the backend: it enters the conversation (after the dialogue so
        far) as the request for it starts."""
        self._sync()
        self._append({"type": "message", "role": "user", "content": [{"type": "input_text", "text": task}]})
        self._run(delegation_id, None)

    def _run(self, delegation_id: str | None, event_id: str | None) -> None:
        body = {k: copy.deepcopy(v) for k, v in (self.settings.responses or {}).items()}
        unanswered = set(self.calls)
        body["input"] = [copy.deepcopy(it) for it in self.items
                         if not (it.get("type") == "function_call" and it.get("call_id") in unanswered)]  # fmt: skip
        body["stream"] = True
        body["store"] = False
        run = self.running = _Run(self._log.new_id("dresp"), delegation_id, event_id)
        self._log.effects.append(RunResponses(run.request_id, body))
        self._log.changed()

    def backend_event(self, request_id: str, event: dict[str, Any]) -> None:
        """One event of the stream of request ``request_id``."""
        run = self.running
        if run is None or run.request_id != request_id:
            return  # (a request cancelled or superseded)
        kind = event.get("type")
        fields: dict[str, Any] = {"event": slim(event)}
        if run.delegation_id is not None:
            fields["delegation_id"] = run.delegation_id
        if run.event_id is not None:
            fields["client_event_id"] = run.event_id
        self._log.emit("response.event", **fields)
        if kind in _TERMINAL:
            # Over now, not when the stream closes: a client that answers its response.completed
            # with the next response.create must not find this one still under way.
            self._end(run, None)
        elif kind == "response.output_item.done" and isinstance(event.get("item"), dict):
            self._output(run, event["item"])

    def _output(self, run: _Run, item: dict[str, Any]) -> None:
        """An output item of the response: its messages' text is to be said; it joins the conversation."""
        kind = item.get("type")
        if kind == "message":
            for part in item.get("content") or ():
                if isinstance(part, dict) and part.get("type") == "output_text" and isinstance(part.get("text"), str):
                    run.text.append(part["text"])
            content = [{"type": "output_text", "text": p["text"]} for p in item.get("content") or ()
                       if isinstance(p, dict) and p.get("type") == "output_text"]  # fmt: skip
            self._append({"type": "message", "role": "assistant", "content": content}, made_by=run.request_id)
            self._log.changed()
        elif kind == "function_call" and isinstance(item.get("call_id"), str):
            call: dict[str, Any] = {k: item[k] for k in ("type", "call_id", "name", "arguments") if k in item}
            self.calls[item["call_id"]] = run.delegation_id
            self._append(call, made_by=run.request_id)
            self._log.changed()

    def backend_ended(self, request_id: str, failure: tuple[str, str] | None) -> None:
        """Request ``request_id``'s stream is over: ``failure`` (code, message), or None: it closed.
        A request whose response ended already is not running any more (``backend_event``)."""
        run = self.running
        if run is None or run.request_id != request_id:
            return
        self._end(run, failure or (RESPONSES_BACKEND_UNREACHABLE, "The Responses backend closed its stream "
                                   "before the response ended."))  # fmt: skip

    def _end(self, run: _Run, failure: tuple[str, str] | None) -> None:
        """The request is over: its text is said (or the failure told), and the next task starts."""
        self.running = None
        self._log.changed()
        if failure is not None:
            code, message = failure
            self._log.fail(code, message, run.event_id)
            if run.delegation_id is not None:
                self._voice.tell(f"The task delegated as {run.delegation_id} could not be done: {message}")
        else:
            text = " ".join(t.strip() for t in run.text if t.strip())
            if text:
                self.pending_acks.clear()  # (the result is the acknowledgement)
                self._voice.speak(text)
        if self.queue:
            self._task(*self.queue.pop(0))

    def shutdown(self) -> None:
        """The session is over: the request under way is cancelled."""
        if self.running is not None:
            self._log.effects.append(Cancel(self.running.request_id))
            self.running = None
        self.queue.clear()
        self.pending_acks.clear()

    # --- the Responses conversation ---------------------------------------------------------

    def _sync(self) -> None:
        """The Live conversation's dialogue the Responses conversation does not hold yet."""
        present: set[str] = set()
        for item in self._voice.dialogue():
            present.add(item.id)
            if item.type != "message" or item.role == "system" or item.id in self._copied:
                continue
            if item.status == "in_progress" or item.pending_transcription:
                continue  # (unfinished: it enters once it is)
            self._copied.add(item.id)
            text = item.as_message().text.strip()
            if text:
                part = "input_text" if item.role == "user" else "output_text"
                self._append({"type": "message", "role": item.role, "content": [{"type": part, "text": text}]})
        self._copied &= present

    def _append(self, item: dict[str, Any], *, after: str | None = None, made_by: str | None = None) -> None:
        """``item`` at the end; a call's output (``after``: its call id) right after the calls
        made with that call, where they are (as chat templates want a call's result).
        ``made_by``: the request it is an output of."""
        at = len(self.items)
        calls = [
            i for i, it in enumerate(self.items) if it.get("type") == "function_call" and it.get("call_id") == after
        ]
        if calls:
            at = calls[-1] + 1
            while at < len(self.items) and self.items[at].get("type") in ("function_call", "function_call_output"):
                at += 1
        self.items.insert(at, item)
        self._sizes.insert(at, len(orjson.dumps(item)))
        self._made_by.insert(at, made_by)
        while len(self.items) > MAX_BACKEND_ITEMS or (len(self.items) > 1 and sum(self._sizes) > MAX_BACKEND_BYTES):
            self._drop(0)

    def _drop(self, at: int) -> None:
        dropped = self.items.pop(at)
        self._sizes.pop(at)
        self._made_by.pop(at)
        if dropped.get("type") == "function_call":
            self.calls.pop(dropped.get("call_id", ""), None)

    # --- snapshots -----------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        run = self.running
        return {
            "handed": self.handed,
            "items": self.items,
            "made_by": self._made_by,
            "copied": sorted(self._copied),
            "calls": self.calls,
            "answered": self._answered,
            "running": None if run is None else [run.request_id, run.delegation_id, run.event_id],
            "queue": self.queue,
        }

    def restore(self, d: dict[str, Any]) -> None:
        """A snapshot's state (one written before the Responses conversation: its delegations
        only); a request that was under way runs again (module docstring)."""
        self.handed = dict(d["handed"])
        self.items = list(d.get("items", ()))
        self._sizes = [len(orjson.dumps(it)) for it in self.items]
        self._made_by = list(d.get("made_by", [None] * len(self.items)))
        self._copied = set(d.get("copied", ()))
        self.calls = dict(d.get("calls", {}))
        self._answered = dict(d.get("answered", {}))
        self.queue = [(delegation_id, task) for delegation_id, task in d.get("queue", ())]
        running = d.get("running")
        if running is not None:  # its stream was on the replica lost: it runs again, without what it output
            lost, delegation_id, event_id = running
            for at in reversed([i for i, by in enumerate(self._made_by) if by == lost]):
                self._drop(at)
            self._run(delegation_id, event_id)


def _task_of(arguments: str) -> str | ValueError:
    """The ``task`` of a ``delegate`` call's arguments, or what is wrong with them."""
    try:
        args = json.loads(arguments) if arguments.strip() else None
    except ValueError:
        return ValueError('the arguments are not JSON; call delegate with {"task": "..."}.')
    task = args.get("task") if isinstance(args, dict) else None
    if not isinstance(task, str) or not task.strip():
        return ValueError('\'task\' is missing or empty; call delegate with {"task": "..."}.')
    if len(task) > MAX_TASK_CHARS:
        return ValueError(f"'task' is longer than {MAX_TASK_CHARS} characters; say it more briefly.")
    return task.strip()


def _checked_item(raw: dict[str, Any]) -> dict[str, Any]:
    """A ``response.item.create`` item, checked as far as the gateway relies on it (the backend
    checks the rest): a message, a function call or a function call's output."""
    kind = raw.get("type", "message" if "role" in raw else None)
    if kind not in _ITEM_TYPES:
        raise ProtocolError(Code.UNSUPPORTED if isinstance(kind, str) else Code.INVALID_VALUE,
                            f"'item.type' must be one of {', '.join(_ITEM_TYPES)} (this gateway's Responses "
                            "delegation runs function tools only).", param="item.type")  # fmt: skip
    if kind == "message":
        if raw.get("role") not in ("user", "assistant", "system", "developer"):
            raise ProtocolError(Code.INVALID_VALUE, "'item.role' must be user, assistant, system or developer.",
                                param="item.role")  # fmt: skip
        if not isinstance(raw.get("content"), str | list):
            raise ProtocolError(Code.INVALID_VALUE, "'item.content' must be a string or an array of content parts.",
                                param="item.content")  # fmt: skip
    else:
        if not isinstance(raw.get("call_id"), str) or not raw["call_id"]:
            raise ProtocolError(Code.MISSING_FIELD, "Missing required parameter: 'item.call_id'.",
                                param="item.call_id")  # fmt: skip
        need = ("output",) if kind == "function_call_output" else ("name", "arguments")
        for key in need:
            if key not in raw:
                raise ProtocolError(Code.MISSING_FIELD, f"Missing required parameter: 'item.{key}'.",
                                    param=f"item.{key}")  # fmt: skip
    return copy.deepcopy(raw)
