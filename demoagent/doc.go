// Package demoagent is the ACP (Agent Client Protocol) v1 agent built into
// acpgate. It ships as "acpgate demo-agent", so the gateway works without a
// third-party agent, and the end-to-end tests and the browser client run
// against it.
//
// The agent speaks JSON-RPC 2.0 over a reader/writer pair (stdin/stdout in the
// binary), one JSON message per line. It has no language model. Each prompt
// is answered by a fixed behaviour chosen from its text, and each behaviour
// exercises a different part of the protocol.
//
// # Sessions
//
// session/new creates a session with an id of the form "demo-" followed by 16
// hex digits. The session is stored as <StateDir>/<id>.json with its cwd,
// title, updatedAt and the history of user and agent messages. Because the
// history is on disk, session/load (which replays the history as
// user_message_chunk / agent_message_chunk updates before it answers) and
// session/resume (which does not replay) work in any agent process that
// shares the StateDir. session/list reads that directory (newest first,
// optionally filtered by exact cwd). session/close cancels the running prompt,
// waits for its "cancelled" response and drops the session from memory; the
// file stays, and closing a stored session that is not active here is a
// no-op. Only sessions that were created, loaded or resumed in this process
// accept session/prompt.
//
// # Prompt keywords
//
// The prompt is the concatenated text of its "text" content blocks.
// resource_link and embedded resource blocks are accepted and their URIs
// noted. The agent checks the lower-cased prompt text against the rules below
// in the order listed, and the first rule that matches wins. Keywords match
// whole words: "longer" or "/tmp/long.txt" is not "long".
//
//	keyword             behaviour
//	-------             ---------
//	"slow" or "long"    streams "tick 1 ", "tick 2 ", ... every 100 ms for up to 60 s;
//	                    use session/cancel to stop it (stopReason "cancelled")
//	                    or it ends with "end_turn" after 600 ticks
//	"read <path>"       tool_call (kind "read") + fs/read_text_file; the reply quotes the
//	                    first line and gives the byte and line counts. Needs the client
//	                    capability fs.readTextFile
//	"write <path> [text]"
//	                    tool_call (kind "edit", with a diff) + session/request_permission
//	                    (options "allow" / "reject"; the path as the tool call's
//	                    location); on allow it calls fs/write_text_file
//	                    with the text (default: a greeting line) and replies
//	                    "Wrote N bytes to <path>."; on reject it replies "Permission denied."
//	                    Without the client capability fs.writeTextFile, allow gets a
//	                    reply saying so
//	"permission"        tool_call (kind "execute", "Run a harmless command") +
//	                    session/request_permission; replies "Permission granted (allow)."
//	                    or "Permission denied (reject)."
//	"plan"              a plan update with 3 pending entries, then each entry completed
//	                    in turn (one full-list plan update per step), then a short message
//	"think"             a few agent_thought_chunk updates, then the reply
//	"markdown"          a reply in Markdown: a heading, a list, a fenced code block and
//	                    bold text
//	anything else       "You said: <prompt text>", streamed in chunks of 8 characters
//
// "read" and "write" must be whole words, so "thread" does not count. A
// "path" is the token after the word. It must contain a slash, a backslash or
// a dot. A relative path is resolved against the session's cwd.
// Trailing punctuation and surrounding quotes or backticks are removed. If
// the token after "read" or "write" is not a path, that rule does not match.
//
// For a permission request, an outcome of "cancelled" ends the turn with
// stopReason "cancelled". If session/cancel (or $/cancel_request for the
// session/prompt request, or session/close) arrives while the agent waits for
// the client's answer to one of its own requests, the agent sends
// $/cancel_request for that request, stops waiting and ends the turn with
// "cancelled".
//
// Every turn ends with a session_info_update (the title is the first 40
// characters of the first prompt), followed by the session/prompt response.
// The messages the agent streamed are appended to the history, even when the
// turn was cancelled.
//
// # Other methods
//
// A request that comes before initialize gets error -32600. Unknown methods,
// including extension methods whose names start with "_", get -32601. The one
// exception is "_demo/echo", which returns its params unchanged and is used by
// load tests. A line that is not valid JSON gets -32700 with id null. Unknown
// sessions get -32002 with data {"sessionId": id}. Notifications never get a
// response.
package demoagent
