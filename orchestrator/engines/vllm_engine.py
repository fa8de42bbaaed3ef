"""``VllmEngine``: vLLM's ``AsyncLLM`` in-process, fed through its streaming input.

``respond`` is one resumable vLLM request per response, driven by
``AsyncLLM.generate`` with an async generator of ``StreamingInput``:

- the first chunk is the conversation (``instructions`` as a system turn,
  then ``messages``), rendered with the tokenizer's chat template when it has
  one (else a plain ``role: text`` transcript ending in ``assistant:``);
- each later ``TextChunk`` of the input is tokenized and appended to the same
  request, verbatim, as vLLM's streaming input does: the model sees it after
  what it has generated so far (vLLM keeps the generated tokens in the
  context, all but the last one sampled for the previous chunk);
- the input iterator ending is the final marker.

vLLM generates after *each* chunk, until end of sequence or ``max_tokens``,
then waits for the next one; every token comes back as a ``TextDelta`` (vLLM's
``RequestOutputKind.DELTA``). ``max_output_tokens`` bounds the whole response:
each chunk is sent with what is left of it, and a response that reaches it
is cut there, aborted in vLLM and finished with reason ``length``.

Limits, and what happens when they are hit:

- vLLM's streaming input refuses ``n > 1``, ``FINAL_ONLY`` output and stop
  strings (``stop``; ``stop_token_ids`` are fine). ``validate_sampling``
  checks the same before anything reaches the engine: a violation is an
  ``EngineError("unsupported_sampling_param")`` (at construction for the
  engine-wide ``sampling`` defaults).
- ``max_model_len``: a conversation longer than it fails the response with
  ``invalid_request`` (vLLM's validation message); a response that runs into
  it finishes with reason ``length``.
- text out: a response asking for audio fails with ``unsupported_modality``;
  ``transcribe`` fails with ``unsupported`` (the cascade brings its own
  speech-to-text and can use this model as its thinker: ``VllmThinker``).
- images in only where the model takes them: ``start`` asks vLLM once whether
  the model is multimodal with an image modality and what its image
  placeholder is (``image_placeholder``); then ``info.accepts_images`` is True
  and each image of a user turn is a placeholder line before the turn's text
  in the prompt, the images go with the first chunk as
  ``multi_modal_data["image"]`` (PIL, in order) and vLLM expands each
  placeholder into the model's image tokens (counted as ``input_image_tokens``;
  ``detail`` is not used: the model's processor picks the resolution). A text
  model keeps ``accepts_images`` False (the session refuses the part; a request
  that carries images anyway fails with ``unsupported``). An image that does
  not decode fails with ``invalid_image``; more images than the model's
  ``limit_mm_per_prompt`` fail with ``invalid_request`` before any is decoded
  (images are decoded in a worker thread, one after another), and image tokens
  past ``max_model_len`` with ``invalid_request`` (vLLM's message).
- an engine core that dies fails every running response with
  ``EngineError("engine_dead", fatal=True)`` and ``healthy()`` turns False.

Cancellation: the orchestrator cancels the task iterating ``respond`` and
then calls ``abort``; either one aborts the vLLM request (``AsyncLLM.abort``),
and so does closing the output iterator early.

``start()`` builds the ``AsyncLLM`` in this process (the engine core runs in
child processes vLLM spawns; entry points must be guarded by
``if __name__ == "__main__":``). It blocks the event loop while the model
loads (about 30 s for a tiny model on 2 CPU cores).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from typing import Any, Literal, NoReturn

from orchestrator.engine import (
    AudioChunk,
    EngineError,
    EngineInfo,
    EngineInput,
    EngineOutput,
    Finished,
    FunctionTool,
    Image,
    Message,
    ResponseRequest,
    TextChunk,
    TextDelta,
    ToolCallDelta,
    ToolChoice,
    TranscriptionRequest,
    Usage,
)
from orchestrator.engines.images import conversation_images, decode_image
from orchestrator.engines.streams import failing
from orchestrator.engines.vllm_tools import ToolCalling, chat_messages

log = logging.getLogger("omni.engines.vllm")

IGNORED_FIELDS = ("voice", "speed", "noise_reduction", "include")
_UNSUPPORTED = "unsupported_sampling_param"


# --- vLLM's streaming-input restrictions --------------------------------------


def validate_sampling(params: Any) -> None:
    """Raise ``EngineError("unsupported_sampling_param")`` for what vLLM's
    streaming input refuses (``AsyncLLM._validate_streaming_input_sampling_params``
    in vLLM 0.32): anything but ``SamplingParams`` (pooling), ``n != 1``,
    ``output_kind=FINAL_ONLY``, and stop strings."""
    from vllm.sampling_params import RequestOutputKind, SamplingParams

    if not isinstance(params, SamplingParams):
        raise EngineError(_UNSUPPORTED, "streaming input needs SamplingParams (pooling is not supported)")
    if params.n != 1:
        raise EngineError(_UNSUPPORTED, f"streaming input supports n=1 only (got n={params.n})")
    if params.output_kind == RequestOutputKind.FINAL_ONLY:
        raise EngineError(_UNSUPPORTED, "streaming input cannot use output_kind FINAL_ONLY")
    if params.stop:
        raise EngineError(_UNSUPPORTED, "streaming input does not support stop strings; use stop_token_ids")


def make_sampling(defaults: Mapping[str, Any], *, streaming: bool = True, **overrides: Any) -> Any:
    """``SamplingParams`` from ``defaults`` and the non-None ``overrides``, with
    delta output; for a ``streaming`` input request, checked by
    ``validate_sampling``. Without ``max_tokens``
    a generation may run up to ``max_model_len``. Invalid values (vLLM's own
    checks) raise ``EngineError("invalid_sampling_param")``."""
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import RequestOutputKind, SamplingParams

    kind = defaults.get("output_kind", RequestOutputKind.DELTA)
    if kind != RequestOutputKind.DELTA:
        # Checked first: FINAL_ONLY is also a streaming-input restriction.
        validate_sampling(SamplingParams(output_kind=kind))
        raise EngineError(_UNSUPPORTED, "this engine streams deltas: output_kind must be DELTA")
    # vLLM's own default is 16 tokens; None: up to max_model_len.
    args = {"max_tokens": None, **defaults, **{k: v for k, v in overrides.items() if v is not None}}
    args["output_kind"] = RequestOutputKind.DELTA
    try:
        params = SamplingParams(**args)
    except (TypeError, ValueError, VLLMValidationError) as exc:
        raise EngineError("invalid_sampling_param", f"invalid sampling parameters: {exc}") from exc
    if streaming:
        validate_sampling(params)
    return params


# --- prompts -------------------------------------------------------------------


def render_conversation(
    tokenizer: Any,
    messages: Sequence[Message],
    instructions: str,
    tools: list[dict[str, Any]] | None = None,
    *,
    image_placeholder: str | None = None,
) -> list[int]:
    """Token ids of the conversation, ready for the assistant's answer.

    With a chat template: the template (``add_generation_prompt=True``, and
    ``tools`` for a template that renders them), tokenized without adding
    special tokens again. Without one: a ``role: text`` line per turn (calls
    as ``<tool_call>`` JSON) and a final ``assistant:``, tokenized with the
    tokenizer's own special tokens (BOS). Each image of a turn is an
    ``image_placeholder`` line before its text (None: images are left out)."""
    chat = chat_messages(messages, instructions, image_placeholder)
    if getattr(tokenizer, "chat_template", None):
        kwargs = {"tools": tools} if tools else {}
        text = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True, **kwargs)
        return list(tokenizer.encode(text, add_special_tokens=False))
    lines = []
    for turn in chat:
        calls = "".join(f"<tool_call>{json.dumps(c['function'])}</tool_call>" for c in turn.get("tool_calls", ()))
        lines.append(f"{turn['role']}: {turn['content']}{calls}\n")
    return list(tokenizer.encode("".join(lines) + "assistant:"))


def image_limit(model_config: Any) -> int | None:
    """The model's ``limit_mm_per_prompt`` for images (None where vLLM does not say)."""
    try:
        limit = model_config.multimodal_config.get_limit_per_prompt("image")
    except Exception:
        return None
    return limit if isinstance(limit, int) and not isinstance(limit, bool) else None


def image_placeholder(model_config: Any) -> str | None:
    """What stands for one image in this model's prompt, as vLLM's chat renderer
    writes it (the model class's ``get_placeholder_str``), or None where the model
    takes no images: a text model, a multimodal one without images or with
    ``limit_mm_per_prompt`` 0 for them, or one whose processor places images
    itself (no placeholder). vLLM internals, read once at start-up: where they
    fail, the model is served text only (logged), never a failed start."""
    if not getattr(model_config, "is_multimodal_model", False):
        return None
    try:
        from vllm.model_executor.model_loader import get_model_cls

        if model_config.multimodal_config.get_limit_per_prompt("image") == 0:
            return None
        placeholder = get_model_cls(model_config).get_placeholder_str("image", 1)
    except ValueError:  # vLLM's answer for a modality the model does not have
        return None
    except Exception as exc:
        log.warning("cannot tell whether %s takes images (%r): serving it text only", model_config.model, exc)
        return None
    if not isinstance(placeholder, str) or not placeholder:
        log.warning("vLLM names no image placeholder for %s: serving it text only", model_config.model)
        return None
    return placeholder


def _dead(exc: BaseException | None = None) -> EngineError:
    detail = f": {exc}" if exc is not None and str(exc) else ""
    return EngineError("engine_dead", f"the vLLM engine core died{detail}", fatal=True)


def _start_failure(exc: Exception, args: Mapping[str, Any]) -> str:
    """vLLM's reason, led by the setting to change when it names one of ours."""
    reason = " ".join(str(exc).split())
    if args.get("max_model_len") is not None and "max_model_len" in reason:
        return (
            f"max_model_len={args['max_model_len']} does not fit model {args.get('model')!r}: set the route's "
            f"max_model_len to what the model takes, or leave it unset for the model's own (vLLM: {reason})"
        )
    return f"vLLM failed to start with model {args.get('model')!r}: {reason}"


# --- the engine ----------------------------------------------------------------


class VllmEngine:
    """vLLM ``AsyncLLM`` in-process; text (and images, for a multimodal model) in, text out.

    ``model``: a local path (or hub name, where the hub is reachable).
    ``dtype``: ``float32`` by default (the CPU build crashed on a bf16 first
    request under 5 tokens). ``max_model_len``: the context bound (prompt and
    output together, all chunks of a request included); None (the default)
    takes the model's own, as ``vllm serve`` does. A value the model cannot
    take fails ``start`` with ``engine_start_failed`` naming the setting. ``sampling``: defaults
    for every response's ``SamplingParams`` (e.g. ``top_p``, ``seed``,
    ``ignore_eos``), over the model's own (its ``generation_config.json``,
    as ``vllm serve`` applies them); the response's ``temperature`` and
    ``max_output_tokens`` override both. A ``max_tokens`` default bounds each
    streamed chunk's generation (vLLM's semantics); ``max_output_tokens`` the
    whole response.
    ``llm``: an ``AsyncLLM`` already started, to share (this engine then
    neither builds nor shuts it down). ``tool_parser``: the vLLM tool parser
    that reads this model's calls for ``tool_choice: "auto"`` (see
    ``vllm_tools``; ``required`` and a named function need none). Other keyword arguments go to vLLM's
    ``AsyncEngineArgs`` (``enforce_eager``, ``max_num_seqs``, ...).
    """

    def __init__(
        self,
        model: str,
        *,
        dtype: str = "float32",
        max_model_len: int | None = None,
        sampling: Mapping[str, Any] | None = None,
        llm: Any = None,
        tool_parser: str | None = None,
        **engine_args: Any,
    ) -> None:
        self.model = model
        self.tool_parser = tool_parser  # vLLM's --tool-call-parser name, for tool_choice auto
        self.engine_args: dict[str, Any] = {"model": model, "dtype": dtype, "max_model_len": max_model_len}
        self.engine_args.update(engine_args)
        self.sampling: dict[str, Any] = dict(sampling or {})
        make_sampling(self.sampling)  # a bad default fails now, not on the first response
        self.info = EngineInfo(
            name="vllm",
            description=self._description(images=False),
            voices=(),
            default_voice=None,
            transcription_models=(),
            modalities=("text",),
            ignored_fields=IGNORED_FIELDS,
        )
        self._llm: Any = llm
        self._owns_llm = llm is None
        self._tokenizer: Any = None
        self._image_placeholder: str | None = None  # set by start for a model that takes images
        self._image_limit: int | None = None  # its limit_mm_per_prompt for images (None: not known)
        self._placeholder_tokens = 0  # the placeholder's length in tokens
        self._model_sampling: dict[str, Any] = {}
        self._start_lock = asyncio.Lock()
        self._closed = False
        self._dead = False
        self.active: set[str] = set()  # request ids being served (tests check for leaks)

    def _description(self, *, images: bool) -> str:
        kind = "text and images in, text out" if images else "text only"
        return (
            f"vLLM AsyncLLM in-process serving {self.model} ({kind}): each response is one "
            "resumable streaming-input request; streamed text extends it."
        )

    @property
    def llm(self) -> Any:
        """The ``AsyncLLM`` (None before ``start``)."""
        return self._llm

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    # --- lifecycle ----------------------------------------------------------

    async def start(self) -> None:
        async with self._start_lock:
            if self._tokenizer is not None:
                return
            if self._closed:
                raise EngineError("engine_closed", "the vLLM engine was closed")
            if self._llm is None:
                from vllm.engine.arg_utils import AsyncEngineArgs
                from vllm.v1.engine.async_llm import AsyncLLM

                args = {"disable_log_stats": True, **self.engine_args}
                if "structured_outputs_config" not in args:
                    from vllm.config.structured_outputs import StructuredOutputsConfig

                    # Tool calls are generated compact (vllm_tools): whitespace outside
                    # strings is never sampled. vLLM's xgrammar backend reads this
                    # engine-wide setting (with an explicit backend), not the request's.
                    args["structured_outputs_config"] = StructuredOutputsConfig(
                        backend="xgrammar", disable_any_whitespace=True
                    )
                log.info("starting vLLM: %s", args)
                try:
                    self._llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**args))
                except Exception as exc:
                    self._dead = True
                    raise EngineError("engine_start_failed", _start_failure(exc, args), fatal=True) from exc
            # The model's generation_config.json sampling defaults, as `vllm serve` applies them.
            self._model_sampling = dict(self._llm.model_config.get_diff_sampling_param())
            self._tokenizer = self._llm.get_tokenizer()
            placeholder = image_placeholder(self._llm.model_config)
            if placeholder is not None:
                self._image_placeholder = placeholder
                self._image_limit = image_limit(self._llm.model_config)
                self._placeholder_tokens = len(self._tokenizer.encode(placeholder, add_special_tokens=False))
                self.info = dataclasses.replace(
                    self.info, accepts_images=True, description=self._description(images=True)
                )

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        llm, self._llm = self._llm, None
        if llm is not None and self._owns_llm:
            llm.shutdown()

    def healthy(self) -> bool:
        return self._llm is not None and self._tokenizer is not None and not self._closed and not self._failed()

    def _raise_coded(self, exc: Exception, rid: str) -> NoReturn:
        """Raise vLLM's failure of request ``rid`` as our coded error; any other exception as it is."""
        coded = self._coded(exc, rid)
        if coded is exc:
            raise exc
        raise coded from exc

    def _coded(self, exc: Exception, rid: str) -> Exception:
        """vLLM's failure of request ``rid`` as our coded error (others pass unchanged)."""
        from vllm.exceptions import VLLMClientError
        from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError

        if isinstance(exc, EngineDeadError):
            self._dead = True
            log.error("vLLM engine core died during request %s", rid)
            return _dead(exc)
        if isinstance(exc, VLLMClientError):
            return EngineError("invalid_request", str(exc))
        if isinstance(exc, EngineGenerateError):
            if self._failed():
                return _dead(exc)
            cause = exc.__cause__
            return EngineError("engine_error", f"vLLM failed: {type(cause or exc).__name__}: {cause or exc}")
        return exc

    def _failed(self) -> bool:
        if not self._dead and self._llm is not None and self._llm.errored:
            self._dead = True
        return self._dead

    async def abort(self, request_id: str) -> None:
        llm = self._llm
        if llm is None or self._failed():
            return
        from vllm.v1.engine.exceptions import EngineDeadError

        with contextlib.suppress(EngineDeadError):
            await llm.abort(request_id)

    # --- requests -----------------------------------------------------------

    def transcribe(
        self, request: TranscriptionRequest, inputs: AsyncIterator[AudioChunk]
    ) -> AsyncIterator[EngineOutput]:
        """Not served: this engine is text only (the cascade has its own STT)."""
        return failing(EngineError("unsupported", "the vllm engine does not transcribe speech (text only)"))

    def sampling_params(self, request: ResponseRequest) -> Any:
        """The request's ``SamplingParams`` (``EngineError`` if vLLM's streaming
        input would refuse them)."""
        defaults = {**self._model_sampling, **self.sampling}
        return make_sampling(defaults, temperature=request.temperature, max_tokens=request.max_output_tokens)

    def respond(self, request: ResponseRequest, inputs: AsyncIterator[EngineInput]) -> AsyncIterator[EngineOutput]:
        # Everything checkable is checked now; errors surface where outputs are consumed.
        try:
            self._check_ready()
            if "audio" in request.modalities:
                raise EngineError(
                    "unsupported_modality", "the vllm engine produces text only; set output_modalities to ['text']"
                )
            if self._image_placeholder is None and conversation_images(request.messages):
                raise EngineError(
                    "unsupported", f"model {self.model!r} takes no images (the vllm engine serves it text only)"
                )
            params = self.sampling_params(request)
            if request.request_id in self.active:
                raise EngineError("duplicate_request", f"request {request.request_id!r} is already running")
            if request.calls_tools:
                tools = ToolCalling(request, self._tokenizer, self.tool_parser)
                return self._respond_with_tools(request, params, tools, inputs)
        except EngineError as exc:
            return failing(exc)
        return self._respond(request, params, inputs)

    def _render(
        self, messages: Sequence[Message], instructions: str, tools: list[dict[str, Any]] | None = None
    ) -> list[int]:
        return render_conversation(
            self._tokenizer, messages, instructions, tools, image_placeholder=self._image_placeholder
        )

    async def _engine_input(self, prompt_ids: list[int], images: Sequence[Image]) -> Any:
        """The prompt as vLLM takes it: token ids, with the decoded images (decoded in a
        thread: a large PNG takes a while) as ``multi_modal_data``."""
        from vllm.inputs import TokensPrompt, tokens_input

        if not images:
            return tokens_input(prompt_ids)
        limit = self._image_limit
        if limit is not None and len(images) > limit:  # vLLM would refuse them: none is decoded
            raise EngineError("invalid_request", f"the conversation holds {len(images)} images; model "
                              f"{self.model!r} takes at most {limit} in one prompt (limit_mm_per_prompt)")  # fmt: skip
        decoded = await asyncio.to_thread(lambda: [decode_image(image) for image in images])
        return TokensPrompt(prompt_token_ids=prompt_ids, multi_modal_data={"image": decoded})

    def _usage_in(self, rendered: int, expanded: int | None, images: int) -> tuple[int, int]:
        """(text tokens, image tokens) of a prompt of ``rendered`` tokens that vLLM
        expanded to ``expanded`` (its first output's ``prompt_token_ids``)."""
        if not images or expanded is None:
            return rendered, 0
        placeholders = images * self._placeholder_tokens
        return rendered - placeholders, expanded - rendered + placeholders

    def _check_ready(self) -> None:
        if self._failed():
            raise _dead()
        if self._llm is None or self._tokenizer is None or self._closed:
            raise EngineError("engine_not_ready", "the vLLM engine is not running")

    async def _respond(
        self, request: ResponseRequest, params: Any, inputs: AsyncIterator[EngineInput]
    ) -> AsyncIterator[EngineOutput]:
        from vllm.engine.protocol import StreamingInput
        from vllm.inputs import tokens_input

        rid = request.request_id
        llm, tokenizer = self._llm, self._tokenizer
        limit: int | None = request.max_output_tokens
        prompt_ids = self._render(request.messages, request.instructions)
        images = conversation_images(request.messages)
        first = await self._engine_input(prompt_ids, images)
        counts = {"input": len(prompt_ids), "output": 0}
        expanded: int | None = None  # the first chunk's length once vLLM expanded its images

        async def chunks() -> AsyncGenerator[Any, None]:
            yield StreamingInput(prompt=first)
            async for chunk in inputs:
                if not isinstance(chunk, TextChunk) or not chunk.text:
                    continue  # text only: speech reaches a response already transcribed
                ids = list(tokenizer.encode(chunk.text, add_special_tokens=False))
                if not ids:
                    continue
                counts["input"] += len(ids)
                chunk_params = None
                if limit is not None:
                    chunk_params = params.clone()
                    chunk_params.max_tokens = max(1, limit - counts["output"])
                yield StreamingInput(prompt=tokens_input(ids, prompt=chunk.text), sampling_params=chunk_params)

        text: list[str] = []
        reason: Literal["stop", "length"] = "stop"
        done = False
        self.active.add(rid)
        try:
            async with contextlib.aclosing(llm.generate(chunks(), params, rid)) as outputs:
                async for out in outputs:
                    if expanded is None and out.prompt_token_ids is not None:
                        expanded = len(out.prompt_token_ids)
                    completion = out.outputs[0]
                    ids, delta = list(completion.token_ids), completion.text
                    if limit is not None and counts["output"] + len(ids) >= limit:
                        keep = limit - counts["output"]
                        if keep < len(ids):  # several tokens merged past the limit: cut there
                            delta = tokenizer.decode(ids[:keep], skip_special_tokens=True)
                        counts["output"] = limit
                        if delta:
                            text.append(delta)
                            yield TextDelta(delta)
                        reason = "length"
                        break
                    counts["output"] += len(ids)
                    reason = "length" if completion.finish_reason == "length" else "stop"
                    if delta:
                        text.append(delta)
                        yield TextDelta(delta)
            done = True
        except Exception as exc:
            self._raise_coded(exc, rid)
        finally:
            self.active.discard(rid)
            if not done or reason == "length":
                # Cancelled, failed, closed early or cut at the limit: the request
                # may still be running (or waiting for more input) in vLLM.
                await self.abort(rid)
        text_in, image_in = self._usage_in(len(prompt_ids), expanded, len(images))
        yield Finished(
            reason=reason,
            text="".join(text),
            usage=Usage(
                input_text_tokens=counts["input"] - len(prompt_ids) + text_in,
                input_image_tokens=image_in,
                output_text_tokens=counts["output"],
            ),
        )

    async def _respond_with_tools(
        self, request: ResponseRequest, params: Any, tools: ToolCalling, inputs: AsyncIterator[EngineInput]
    ) -> AsyncIterator[EngineOutput]:
        """A response that may call tools: one ordinary vLLM request, started once
        the input is complete (the structured output and the tool parser read
        one whole answer; streamed text is joined to the last user turn first)."""
        messages = list(request.messages)
        async for chunk in inputs:
            if isinstance(chunk, TextChunk) and chunk.text:
                last = messages[-1] if messages else None
                if last is not None and last.role == "user":
                    messages[-1] = dataclasses.replace(last, text=f"{last.text} {chunk.text}".strip())
                else:
                    messages.append(Message("user", chunk.text))
        params = params.clone()
        params.structured_outputs = tools.structured_outputs
        params.skip_special_tokens = tools.skip_special_tokens
        prompt = self._render(messages, request.instructions, tools.chat_tools or None)
        images = conversation_images(messages)
        async for out in self._generate(request.request_id, prompt, params, tools.feed, images):
            yield out

    async def _generate(
        self, rid: str, prompt: list[int], params: Any, read: Any, images: Sequence[Image] = ()
    ) -> AsyncIterator[EngineOutput]:
        """One ordinary request: ``read(delta_text, token_ids)`` turns each piece into outputs."""
        engine_input = await self._engine_input(prompt, images)
        text: list[str] = []
        output_tokens = 0
        expanded: int | None = None
        reason: Literal["stop", "length"] = "stop"
        done = False
        self.active.add(rid)
        try:
            async with contextlib.aclosing(self._llm.generate(engine_input, params, rid)) as outputs:
                async for out in outputs:
                    if expanded is None and out.prompt_token_ids is not None:
                        expanded = len(out.prompt_token_ids)
                    completion = out.outputs[0]
                    output_tokens += len(completion.token_ids)
                    reason = "length" if completion.finish_reason == "length" else "stop"
                    for piece in read(completion.text, completion.token_ids):
                        if isinstance(piece, TextDelta):
                            text.append(piece.text)
                        yield piece
            done = True
        except Exception as exc:
            self._raise_coded(exc, rid)
        finally:
            self.active.discard(rid)
            if not done:
                await self.abort(rid)
        text_in, image_in = self._usage_in(len(prompt), expanded, len(images))
        yield Finished(
            reason=reason,
            text="".join(text),
            usage=Usage(input_text_tokens=text_in, input_image_tokens=image_in, output_text_tokens=output_tokens),
        )


# --- the cascade's thinker -------------------------------------------------------


class VllmThinker:
    """The cascade's ``Thinker`` backed by a ``VllmEngine``'s ``AsyncLLM``.

    Each ``think`` is one ordinary vLLM request (the cascade has the whole
    conversation by then) streaming text deltas; the cascade speaks each
    sentence as it completes, before the last token. ``max_tokens`` bounds an
    answer; ``sampling``: more ``SamplingParams`` fields (stop strings
    included: this is no streaming-input request). The engine is started
    on first use if nobody started it, which blocks the event loop while the
    model loads: an owner should call ``start`` up front (and ``close``).
    A dead engine core fails the answer with ``EngineError("engine_dead",
    fatal=True)``, which the cascade passes on. It calls tools as the ``vllm``
    engine does (``vllm_tools``: the engine's ``tool_parser`` for ``auto``); a
    call under structured outputs is not bounded by ``max_tokens`` (its schema
    ends it; a call cut short would be none).
    """

    calls_tools = True

    def __init__(self, engine: VllmEngine, *, max_tokens: int = 256, **sampling: Any) -> None:
        self.engine = engine
        self.max_tokens = max_tokens
        self.sampling = sampling
        self.description = f"vLLM {engine.model} (AsyncLLM in-process, up to {max_tokens} tokens)"
        self._n = 0

    async def start(self) -> None:
        await self.engine.start()

    async def close(self) -> None:
        await self.engine.close()

    def healthy(self) -> bool:
        return self.engine.healthy()

    async def think(
        self,
        messages: tuple[Message, ...],
        instructions: str,
        *,
        tools: tuple[FunctionTool, ...] = (),
        tool_choice: ToolChoice | None = None,
        parallel_tool_calls: bool = True,
    ) -> AsyncIterator[str | ToolCallDelta]:
        from vllm.inputs import tokens_input
        from vllm.v1.engine.exceptions import EngineDeadError

        engine = self.engine
        await engine.start()
        engine._check_ready()
        defaults = {**engine._model_sampling, "max_tokens": self.max_tokens, **self.sampling}
        params = make_sampling(defaults, streaming=False)  # one prompt: stop strings are fine here
        self._n += 1
        rid = f"think-{id(self):x}-{self._n}"
        request = ResponseRequest(
            rid, messages, tools=tools, tool_choice=tool_choice or ToolChoice(), parallel_tool_calls=parallel_tool_calls
        )
        if request.calls_tools:
            calling = ToolCalling(request, engine.tokenizer, engine.tool_parser)
            if calling.structured_outputs is not None:
                params.max_tokens = None  # a call cut short is no call: the schema's end ends it
            params.structured_outputs = calling.structured_outputs
            params.skip_special_tokens = calling.skip_special_tokens
            prompt = render_conversation(engine.tokenizer, messages, instructions, calling.chat_tools or None)
            async for out in engine._generate(rid, prompt, params, calling.feed):
                if isinstance(out, TextDelta):
                    yield out.text
                elif isinstance(out, ToolCallDelta):
                    yield out
            return
        prompt = render_conversation(engine.tokenizer, messages, instructions)
        try:
            async with contextlib.aclosing(engine.llm.generate(tokens_input(prompt), params, rid)) as outputs:
                async for out in outputs:
                    delta = out.outputs[0].text
                    if delta:
                        yield delta
        except EngineDeadError as exc:
            engine._dead = True
            raise _dead(exc) from exc
