"""One pass over a reply: an engine's stream cut into SSE events once (events.py), and each
event, in turn, with its opening mended, its thinking split in its route's shape (the one
splitter in thinking.py; one shaper and one opening per route shape: choices.py for chat and
completions, responses.py, messages.py), the asked model name put back (names.py), and the
call's figures in a comment just before ``data: [DONE]`` (events.py). Bytes in, bytes out:
no HTTP, no box.

The fast path: a chunk of whole events that no stage would change goes on as it came, not
even cut (a 1-token chat's chunks, after its first, take it).

Openings. llama-server sends a stream's opening with its first generated token
(``n_decoded == 1``, tools/server/server-task.cpp), and sends no piece at all for a token
that ends inside a UTF-8 character (server-context.cpp, ``validate_utf8``). A reply whose
first token is the first byte of an emoji or a CJK character therefore opens without its
opening:
- ``/v1/messages``: no ``message_start`` (the Anthropic SDK's stream reader cannot build a
  message without it);
- ``/v1/chat/completions``: no first chunk with ``"role":"assistant"`` (per choice);
- ``/v1/responses``: ``response.created`` and ``response.in_progress`` again before every
  later piece (the flag that sends them once is set only at ``n_decoded == 1``).
The opening stages (one per route shape, beside its shaper: ``ChatOpening`` in choices.py,
``ResponsesOpening`` in responses.py, ``MessagesOpening`` in messages.py) put back what is
missing and drop what is repeated, event by event, and let every other byte through as it
came: only a stream's first events are read, and a Responses stream's chunks only where one
of its opening events is in them. The ``message_start`` a Messages stream lacks is made by
the pass itself, which may await the prompt's count for it.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping, Sequence

from fitbox.server.streams import thinking
from fitbox.server.streams.choices import ChatOpening, ChatShaper, CompletionShaper
from fitbox.server.streams.events import SEP, EventCutter, Stage, done_at, sse_comment
from fitbox.server.streams.messages import MessagesOpening, MessagesShaper, message_start
from fitbox.server.streams.names import NameRewrite, rewrite_for
from fitbox.server.streams.responses import ResponsesOpening, ResponsesShaper
from fitbox.server.streams.thinking import CHAT, COMPLETIONS, MESSAGES, RESPONSES, Thinking

Count = Callable[[], Awaitable[int | None]]
Stamps = Mapping[str, float | None]


class Pass:
    """The events of one stream through ``stages``, then renamed and timed: ``feed`` each
    chunk, ``finish`` at its end. Only whole events come out (a cut one waits)."""

    def __init__(
        self,
        stages: Sequence[Stage],
        names: NameRewrite | None = None,
        stamps: Stamps | None = None,
    ) -> None:
        self.stages = stages
        self.names = names
        self.stamps = stamps
        self.timed = stamps is None  # the figures' comment went (or none is wanted)
        self.cutter = EventCutter()

    def feed(self, chunk: bytes) -> bytes:
        stages = self.stages
        if not self.cutter.pending and chunk.endswith(SEP):
            # a stage that passes the chunk passes what an earlier stage makes of it too
            # (an opening is made of the chunk's own fields, or an event is dropped)
            stages = [stage for stage in stages if not stage.passes(chunk)]
            if not stages:
                return self._named_and_timed(chunk)  # as it came, not even cut
        events = self.cutter.whole(chunk)
        for stage in stages:
            events = [out for event in events for out in stage.event(event)]
        return self._named_and_timed(b"".join(event + SEP for event in events))

    def finish(self) -> bytes:
        """What was held when the stream ended (an event with no ``\\n\\n``), as it came."""
        return self._named_and_timed(self.cutter.finish())

    def _named_and_timed(self, out: bytes) -> bytes:
        if self.names is not None and out:
            out = self.names.whole(out)
        if self.timed or not out or self.stamps is None:
            return out
        if self.stamps.get("last_byte_at") is None:  # stamped when the engine's end came
            return out
        self.timed = True
        at = done_at(out)
        comment = sse_comment(self.stamps)
        return out[:at] + comment + out[at:] if at >= 0 else out + comment


def stages_for(endpoint: str, target: Thinking | None, slots: int = 1) -> list[Stage]:
    """The stages a stream on ``endpoint`` goes through: its opening, then its thinking."""
    stages: list[Stage] = []
    if endpoint == CHAT:
        stages.append(ChatOpening(slots))
    elif endpoint == RESPONSES:
        stages.append(ResponsesOpening())
    elif endpoint == MESSAGES:
        stages.append(MessagesOpening())
    if target is not None and target.splits:
        stages.append(shaper_for(target))
    return stages


def shaper_for(target: Thinking) -> Stage:
    """The one thinking shaper of ``target``'s route shape."""
    if target.path == COMPLETIONS:
        return CompletionShaper(target.field)
    if target.path == RESPONSES:
        return ResponsesShaper()
    if target.path == MESSAGES:
        return MessagesShaper()
    return ChatShaper(target.field)


class Reshape:
    """One reply's reshaping: ``stream`` for an event stream, ``whole`` for a whole reply.

    ``endpoint`` is the engine route; ``served`` the name the engine answers with, ``asked``
    the client's; ``target`` where the thinking goes (thinking.target); ``slots`` the
    choices a chat stream has; ``count`` the prompt's tokens, awaited only where a Messages
    stream's ``message_start`` is made; ``stamps`` the call's, for the figures' comment."""

    def __init__(
        self,
        endpoint: str,
        served: str,
        asked: str,
        target: Thinking | None,
        slots: int = 1,
        count: Count | None = None,
        stamps: Stamps | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.served = served
        self.names = rewrite_for(served, asked)
        self.target = target
        self.slots = slots
        self.count = count
        self.stamps = stamps

    def whole(self, content: bytes) -> bytes:
        content = thinking.whole(content, self.target)
        return self.names.whole(content) if self.names is not None else content

    async def stream(self, chunks: AsyncIterator[bytes]) -> AsyncGenerator[bytes, None]:
        """``chunks`` reshaped; closing this closes ``chunks`` at once (its end releases the
        call's lease)."""
        stages = stages_for(self.endpoint, self.target, self.slots)
        opening = stages[0] if stages and isinstance(stages[0], MessagesOpening) else None
        one = Pass(stages, self.names, self.stamps)
        try:
            async for chunk in chunks:
                out = one.feed(chunk)
                if opening is not None and opening.missing:
                    opening.missing = False
                    out = await self._message_start() + out
                if out:
                    yield out
            if rest := one.finish():
                yield rest
        finally:
            close = getattr(chunks, "aclose", None)
            if close is not None:
                await close()

    async def _message_start(self) -> bytes:
        start = message_start(self.served, await self.count() if self.count else None)
        return self.names.whole(start) if self.names is not None else start
