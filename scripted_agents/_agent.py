"""The declared-turn ACP agent: plays a scenario's turns, misbehaviour included.

One process serves any number of sessions (one per task). The main thread
reads stdin; each `session/prompt` plays on a worker thread, so a
`session/cancel` is seen while a turn is running.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import threading
import time

from ._scenario import Scenario, TaskScript, Turn
from ._wire import RemoteError, Wire

TYPE_CHECKING = False  # see _scenario.py: no typing import at run time
if TYPE_CHECKING:
    from typing import Any

__all__ = ["ScriptedAgent"]

DEFAULT_OPTIONS = [
    {"optionId": "allow", "name": "Allow", "kind": "allow_once"},
    {"optionId": "allow-always", "name": "Always allow", "kind": "allow_always"},
    {"optionId": "reject", "name": "Reject", "kind": "reject_once"},
]
MAX_SESSIONS = 64  # state kept for the most recent sessions only


class _Session:
    def __init__(self, session_id: str, cwd: str, task_id: str | None, title: str | None) -> None:
        self.id = session_id
        self.cwd = cwd
        self.task_id = task_id
        self.title = title
        self.script: TaskScript | None = None
        self.turns_played = 0
        self.cancel = threading.Event()
        self.mcp_servers: list[dict[str, Any]] = []


class _Stop(Exception):
    """Ends a turn early with a stop reason."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ScriptedAgent:
    def __init__(self, scenario: Scenario, wire: Wire) -> None:
        self.scenario = scenario
        self.wire = wire
        self.client_caps: dict[str, Any] = {}
        self.sessions: collections.OrderedDict[str, _Session] = collections.OrderedDict()
        self._session_ids = 0
        self.leaked: list[object] = []  # what `leak` steps keep alive: fds and threads

    # --- the reader loop -----------------------------------------------------------------------

    def serve(self, stdin: Any) -> None:
        for step in self.scenario.startup:
            _Player(self, None, Turn(), "").play_step(step)
        for line in stdin:
            if not line.strip():
                continue
            message = json.loads(line)
            if "method" not in message:
                self.wire.deliver(message)
            elif "id" in message:
                self._request(message)
            elif message["method"] == "session/cancel":
                cancelled = self.sessions.get(str((message.get("params") or {}).get("sessionId")))
                if cancelled is not None:
                    cancelled.cancel.set()
        self.wire.closed.set()

    def _request(self, message: dict[str, Any]) -> None:
        method, params, request_id = message["method"], message.get("params") or {}, message["id"]
        if method == "initialize":
            self.client_caps = params.get("clientCapabilities") or {}
            self.wire.respond(
                request_id,
                {
                    "protocolVersion": self.scenario.protocol_version,
                    "agentCapabilities": {
                        "loadSession": False,
                        "sessionCapabilities": {"close": {}},
                        "mcpCapabilities": {"http": self.scenario.mcp_http, "sse": False},
                    },
                    "agentInfo": {"name": self.scenario.name, "version": "0.1.0"},
                    "authMethods": [],
                },
            )
        elif method == "session/new":
            self._session_ids += 1
            meta = (params.get("_meta") or {}).get("loopHarness") or {}
            session = _Session(
                f"sess_{self._session_ids}", params.get("cwd", ""), meta.get("taskId"), meta.get("title")
            )
            session.mcp_servers = [s for s in params.get("mcpServers") or [] if s.get("type") == "http"]
            self.sessions[session.id] = session
            while len(self.sessions) > MAX_SESSIONS:
                self.sessions.popitem(last=False)
            self.wire.respond(request_id, {"sessionId": session.id})
        elif method == "session/close":
            closed = self.sessions.pop(str(params.get("sessionId")), None)
            if closed is not None and closed.script is not None and closed.turns_played:
                last = closed.script.turn(closed.turns_played - 1)
                if last.on_close:  # played here, on the reader: nothing else is read until it is answered
                    _Player(self, closed, Turn(last.on_close), "").play()
            self.wire.respond(request_id, {})
        elif method == "session/prompt":
            prompted = self.sessions.get(str(params.get("sessionId")))
            if prompted is None:
                self.wire.respond_error(request_id, -32602, "Invalid params", {"sessionId": "unknown session"})
                return
            worker = threading.Thread(target=self._prompt, args=(prompted, params, request_id), daemon=True)
            worker.start()
        else:
            self.wire.respond_error(request_id, -32601, "Method not found", {"method": method})

    def _prompt(self, session: _Session, params: dict[str, Any], request_id: Any) -> None:
        text = "".join(b.get("text", "") for b in params.get("prompt") or [] if isinstance(b, dict))
        if session.script is None:
            session.script = self.scenario.script_for(session.task_id, session.title, text)
        if session.script is None:
            self.wire.respond_error(request_id, -32603, "Internal error", {"details": "no scenario matches"})
            return
        turn = session.script.turn(session.turns_played)
        session.turns_played += 1
        session.cancel.clear()
        try:
            reason = _Player(self, session, turn, text).play()
        except EOFError:
            return
        self.wire.respond(request_id, {"stopReason": reason})
        if turn.after_stop:  # calls that come after the turn's answer (a misbehaving agent)
            try:
                _Player(self, session, Turn(turn.after_stop), text).play()
            except EOFError:
                return


class _Player:
    """Plays one turn's steps for one session."""

    def __init__(self, agent: ScriptedAgent, session: _Session | None, turn: Turn, prompt: str) -> None:
        self.agent = agent
        self.wire = agent.wire
        self.session = session
        self.turn = turn
        self.prompt = prompt
        self.open_calls: list[str] = []
        self._call_ids = 0

    def play(self) -> str:
        try:
            for step in self.turn.steps:
                self._check_cancel()
                self.play_step(step)
            self._check_cancel()
        except _Stop as stop:
            return stop.reason
        for call_id in self.open_calls:
            self._update({"sessionUpdate": "tool_call_update", "toolCallId": call_id, "status": "completed"})
        return self.turn.stop

    def play_step(self, step: dict[str, Any]) -> None:
        kind, arg = next(iter(step.items()))
        getattr(self, f"_step_{kind}")(arg)

    # --- cancellation --------------------------------------------------------------------------

    def _check_cancel(self) -> None:
        if self.session is not None and self.session.cancel.is_set():
            self._cancelled()

    def _cancelled(self) -> None:
        if self.turn.ignore_cancel:
            threading.Event().wait()  # never answer: the kernel must kill us
        raise _Stop(self.turn.cancel_stop_reason)

    # --- helpers -------------------------------------------------------------------------------

    def _update(self, update: dict[str, Any]) -> None:
        assert self.session is not None
        self.wire.notify("session/update", {"sessionId": self.session.id, "update": update})

    def _abs(self, path: str) -> str:
        if os.path.isabs(path) or self.session is None:
            return path
        return os.path.join(self.session.cwd, path)

    def _message(self, text: str) -> None:
        self._update({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}})

    def _client_request(self, method: str, params: dict[str, Any], on_error: str, session_id: str | None = None) -> Any:
        assert self.session is not None
        try:
            return self.wire.request(method, {"sessionId": session_id or self.session.id, **params})
        except RemoteError as exc:
            self._message(f"{method} failed: {exc}")
            if on_error == "continue":
                return None
            raise _Stop("cancelled" if on_error == "cancelled" else "end_turn") from None

    # --- steps ---------------------------------------------------------------------------------

    def _step_message(self, text: str) -> None:
        self._message(str(text))

    def _step_thought(self, text: str) -> None:
        self._update({"sessionUpdate": "agent_thought_chunk", "content": {"type": "text", "text": str(text)}})

    def _step_echo_prompt(self, _: Any) -> None:
        self._message(f"prompt: {self.prompt}")

    def _step_plan(self, entries: list[dict[str, Any]]) -> None:
        plan = [
            {"content": e["content"], "priority": e.get("priority", "medium"), "status": e.get("status", "pending")}
            for e in entries
        ]
        self._update({"sessionUpdate": "plan", "entries": plan})

    def _step_usage(self, usage: dict[str, Any]) -> None:
        self._update({"sessionUpdate": "usage_update", "used": usage.get("used", 0), "size": usage.get("size", 0)})

    def _step_tool_call(self, spec: dict[str, Any]) -> None:
        self._call_ids += 1
        call_id = str(spec.get("id", f"call_{self._call_ids}"))
        call: dict[str, Any] = {"toolCallId": call_id, "title": spec.get("title", call_id)}
        if spec.get("kind") is not None:
            call["kind"] = spec["kind"]
        if spec.get("locations"):
            call["locations"] = [{"path": self._abs(p)} for p in spec["locations"]]
        if "raw_input" in spec:
            call["rawInput"] = spec["raw_input"]
        if "content" in spec:
            call["content"] = spec["content"]
        self._update({"sessionUpdate": "tool_call", "status": "pending", **call})
        permission = spec.get("permission", False)
        if not permission:
            self._update({"sessionUpdate": "tool_call_update", "toolCallId": call_id, "status": "in_progress"})
            self.open_calls.append(call_id)
            return
        permission = permission if isinstance(permission, dict) else {}
        options = permission.get("options", DEFAULT_OPTIONS)
        assert self.session is not None
        answer = self.wire.request(
            "session/request_permission", {"sessionId": self.session.id, "toolCall": call, "options": options}
        )
        outcome = (answer or {}).get("outcome") or {}
        if outcome.get("outcome") != "selected":
            raise _Stop("cancelled")
        chosen = next((o for o in options if o["optionId"] == outcome.get("optionId")), None)
        if chosen is None or not chosen["kind"].startswith("allow"):
            self._update({"sessionUpdate": "tool_call_update", "toolCallId": call_id, "status": "failed"})
            on_reject = permission.get("on_reject", "end_turn")
            if on_reject != "continue":
                raise _Stop("cancelled" if on_reject == "cancelled" else "end_turn")
            return
        self._update({"sessionUpdate": "tool_call_update", "toolCallId": call_id, "status": "in_progress"})
        self.open_calls.append(call_id)

    def _step_tool_calls(self, spec: dict[str, Any]) -> None:
        """`count` tool calls in a row (no permission asked), each `completed` at once unless `status` says
        otherwise; `same: true` repeats one call exactly, else each has its own arguments; `interval`
        seconds between them (a cancel ends the wait)."""
        for index in range(int(spec["count"])):
            if index and spec.get("interval"):
                self._step_sleep(spec["interval"])
            self._check_cancel()
            call_id = f"{spec.get('prefix', 'many')}_{index}"
            raw = {"command": spec.get("command", "true")} if spec.get("same") else {"command": f"echo {index}"}
            self._update({"sessionUpdate": "tool_call", "toolCallId": call_id, "title": spec.get("title", "Run"),
                          "kind": spec.get("kind", "execute"), "status": "pending", "rawInput": raw})  # fmt: skip
            self._update({"sessionUpdate": "tool_call_update", "toolCallId": call_id,
                          "status": spec.get("status", "completed")})  # fmt: skip

    def _step_elicit(self, spec: dict[str, Any]) -> None:
        """Ask the client a question (elicitation/create, form mode) and say what came back."""
        assert self.session is not None
        params = {"sessionId": self.session.id, "mode": "form", "message": spec["message"],
                  "requestedSchema": {"type": "object", **spec["schema"]}}  # fmt: skip
        try:
            answer = self.wire.request("elicitation/create", params)
        except RemoteError as exc:
            self._message(f"elicitation failed: {exc}")
            return
        self._message(f"elicitation answer: {json.dumps(answer, sort_keys=True)}")

    def _step_tool_update(self, spec: dict[str, Any]) -> None:
        update = {"sessionUpdate": "tool_call_update", "toolCallId": spec["id"]}
        update.update({k: v for k, v in spec.items() if k != "id"})
        self._update(update)
        if spec.get("status") in ("completed", "failed") and spec["id"] in self.open_calls:
            self.open_calls.remove(spec["id"])

    def _step_write(self, spec: dict[str, Any]) -> None:
        params = {"path": self._abs(spec["path"]), "content": spec.get("content", "")}
        self._client_request("fs/write_text_file", params, spec.get("on_error", "end_turn"), spec.get("session"))

    def _step_read(self, spec: dict[str, Any]) -> None:
        params: dict[str, Any] = {"path": self._abs(spec["path"])}
        for key in ("line", "limit"):
            if key in spec:
                params[key] = spec[key]
        result = self._client_request("fs/read_text_file", params, spec.get("on_error", "end_turn"))
        if result is not None and "expect" in spec and result.get("content") != spec["expect"]:
            self._message(f"read mismatch: {result.get('content')!r} != {spec['expect']!r}")

    def _step_terminal(self, spec: dict[str, Any]) -> None:
        params: dict[str, Any] = {"command": spec["command"]}
        if "args" in spec:  # without args the command is a whole script (claude-code-acp 0.16 sends that)
            params["args"] = list(spec["args"])
        if "cwd" in spec:
            params["cwd"] = self._abs(spec["cwd"])
        if "env" in spec:
            params["env"] = [{"name": k, "value": str(v)} for k, v in spec["env"].items()]
        if "output_byte_limit" in spec:
            params["outputByteLimit"] = spec["output_byte_limit"]
        created = self._client_request("terminal/create", params, spec.get("on_error", "end_turn"), spec.get("session"))
        if created is None:
            return
        terminal = {"terminalId": created["terminalId"]}
        if not spec.get("wait", True):  # leave it running (the kernel releases it with the session)
            self._message(f"$ {spec['command']} started as {created['terminalId']}")
            return
        status = self._client_request("terminal/wait_for_exit", terminal, "continue") or {}
        output = self._client_request("terminal/output", terminal, "continue") or {}
        self._client_request("terminal/release", terminal, "continue")
        tail = (output.get("output") or "")[-500:]
        self._message(
            f"$ {spec['command']} {' '.join(params.get('args', []))} -> exit {status.get('exitCode')}\n{tail}"
        )
        if status.get("exitCode") != 0 and spec.get("on_failure", "continue") != "continue":
            raise _Stop("end_turn")

    def _step_run(self, spec: dict[str, Any]) -> None:
        """Run a shell script ourselves, not through the client (as Codex and Claude Code run their commands):
        only the OS sandbox bounds it. Its exit status and output come back as a message."""
        import subprocess

        cwd = self._abs(spec.get("cwd", ".")) if self.session is not None else os.getcwd()
        done = subprocess.run(["bash", "-c", spec["script"]], cwd=cwd, capture_output=True, text=True, timeout=60)
        self._message(f"ran {spec['script']!r} -> exit {done.returncode}\n{(done.stdout + done.stderr)[-2000:]}")

    def _step_sleep(self, seconds: float) -> None:
        if self.session is None:
            time.sleep(float(seconds))
        elif self.session.cancel.wait(float(seconds)):
            self._cancelled()

    def _step_hang(self, _: Any) -> None:
        assert self.session is not None
        self.session.cancel.wait()
        self._cancelled()

    def _step_crash(self, spec: Any) -> None:
        spec = spec if isinstance(spec, dict) else {}
        sys.stderr.write(spec.get("stderr", "scripted crash\n"))
        sys.stderr.flush()
        os._exit(int(spec.get("exit_code", 3)))

    def _step_garbage(self, spec: Any) -> None:
        spec = spec if isinstance(spec, dict) else {"text": str(spec)}
        newline = b"\n" if spec.get("newline", True) else b""
        if "hex" in spec:  # bytes no text can carry (e.g. invalid UTF-8)
            self.wire.write_raw(bytes.fromhex(spec["hex"]) + newline)
            return
        self.wire.write_raw(spec.get("text", "this is not JSON-RPC").encode() + newline)

    def _step_stderr_flood(self, size: int) -> None:
        chunk = b"E" * 65536
        left = int(size)
        while left > 0:
            sys.stderr.buffer.write(chunk[: min(left, len(chunk))])
            left -= len(chunk)
        sys.stderr.buffer.flush()

    def _step_spawn_child(self, spec: Any) -> None:
        """Start a child that inherits our stdio (so it holds the pipes open) and outlives the turn."""
        import subprocess

        spec = spec if isinstance(spec, dict) else {}
        # `setsid: true`: the child leaves our process group and session, as a daemonising tool would
        child = subprocess.Popen(["sleep", str(spec.get("seconds", 300))], start_new_session=spec.get("setsid", False))
        if self.session is not None:
            self._message(f"child pid {child.pid}")

    def _step_leak(self, what: str) -> None:
        """Leak one `fd` or `thread` in this process for good (the soak's agent-side checks must catch it)."""
        if what == "fd":
            self.agent.leaked.append(os.open(os.devnull, os.O_RDONLY))
        elif what == "thread":
            thread = threading.Thread(target=threading.Event().wait, name="leaked", daemon=True)
            thread.start()
            self.agent.leaked.append(thread)
        else:
            raise ValueError(f"leak: 'fd' or 'thread', not {what!r}")

    def _step_growing_message(self, size: int) -> None:
        """A message `size` bytes longer with every session: a transcript that grows per task."""
        self._message("g" * int(size) * self.agent._session_ids)

    def _mcp(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """One JSON-RPC call to the session's first HTTP MCP server (stateless JSON mode)."""
        import urllib.error
        import urllib.request

        assert self.session is not None
        if not self.session.mcp_servers:
            return {"error": {"code": -1, "message": "the session has no HTTP MCP server"}}
        server = self.session.mcp_servers[0]
        headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        headers.update({h["name"]: h["value"] for h in server.get("headers") or []})
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode()
        request = urllib.request.Request(server["url"], data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                answer: dict[str, Any] = json.loads(response.read())
                return answer
        except urllib.error.HTTPError as exc:
            return {"error": {"code": exc.code, "message": exc.read().decode(errors="replace")}}

    def _step_mcp_list(self, _: Any) -> None:
        answer = self._mcp("tools/list", {})
        names = [t["name"] for t in (answer.get("result") or {}).get("tools", [])]
        self._message(f"mcp tools: {', '.join(names)}" if "result" in answer else f"mcp error: {answer['error']}")

    def _step_mcp_call(self, spec: dict[str, Any]) -> None:
        self._call_ids += 1
        call_id = f"mcp_{self._call_ids}"
        tool = spec["tool"]
        self._update({"sessionUpdate": "tool_call", "toolCallId": call_id, "title": f"mcp: {tool}", "kind": "other",
                      "status": "in_progress", "rawInput": spec.get("arguments", {})})  # fmt: skip
        answer = self._mcp("tools/call", {"name": tool, "arguments": spec.get("arguments", {})})
        result = answer.get("result") or {}
        failed = "error" in answer or result.get("isError")
        text = "".join(c.get("text", "") for c in result.get("content", [])) if "result" in answer else ""
        self._update({"sessionUpdate": "tool_call_update", "toolCallId": call_id,
                      "status": "failed" if failed else "completed"})  # fmt: skip
        self._message(f"mcp {tool}: {answer['error']['message']}" if "error" in answer else f"mcp {tool}: {text}")
        if failed and spec.get("on_error", "continue") != "continue":
            raise _Stop("end_turn")

    def _step_big_message(self, size: int) -> None:
        self._message("x" * int(size))
