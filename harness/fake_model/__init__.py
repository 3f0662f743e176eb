"""Stand-ins for the model APIs real ACP adapters call, on loopback: the OpenAI Responses API (Codex) and the
Anthropic Messages API (Claude Code), each answering from a script, so an adapter can be driven offline with no
key (`loop-harness fake-model`, the plugin's `fake_responses` and `fake_messages` fixtures, the adapter tests).

`_script` (the YAML script format), `_base` (what both servers share), `_responses` and `_messages` (one API
each), `_loopback` (the threaded HTTP server), `_cli` (`loop-harness fake-model`). Import the module you need.
"""
