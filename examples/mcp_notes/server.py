"""A notes app as an MCP server (the SDK's own server API), for the MCP environment example:
`python server.py` serves it over stdio. Every process starts from the same four notes."""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

START = {
    1: {"title": "Groceries", "body": "eggs, milk, rye bread", "tags": ["home"]},
    2: {"title": "Dentist", "body": "Thursday 3pm with Dr. Alvarez", "tags": ["health"]},
    3: {"title": "Wifi", "body": "network harbor-5g, password cobalt-42", "tags": ["home"]},
    4: {
        "title": "Book club",
        "body": "next book: The Dispossessed, meeting on the 12th",
        "tags": [],
    },
}


def make_server() -> MCPServer:
    server = MCPServer("notes", log_level="WARNING")
    notes = {k: dict(v) for k, v in START.items()}

    @server.tool()
    def search_notes(query: str) -> list[dict[str, object]]:
        """Find notes whose title, body or tags contain the query (case-insensitive)."""
        q = query.lower().strip()
        return [
            {"note_id": k, "title": n["title"]}
            for k, n in sorted(notes.items())
            if q in f"{n['title']} {n['body']} {' '.join(n['tags'])}".lower()  # type: ignore[arg-type]
        ]

    @server.tool()
    def read_note(note_id: int) -> dict[str, object]:
        """Read one note by its id."""
        if note_id not in notes:
            raise ToolError(f"no note {note_id}; search_notes finds ids")
        return {"note_id": note_id, **notes[note_id]}

    @server.tool()
    def add_note(title: str, body: str, tags: list[str] | None = None) -> dict[str, object]:
        """Save a new note."""
        if not title.strip():
            raise ToolError("a note needs a title")
        note_id = max(notes, default=0) + 1
        notes[note_id] = {"title": title.strip(), "body": body, "tags": tags or []}
        return {"note_id": note_id, "saved": True}

    @server.tool()
    def delete_note(note_id: int) -> dict[str, object]:
        """Delete a note by its id."""
        if notes.pop(note_id, None) is None:
            raise ToolError(f"no note {note_id}")
        return {"note_id": note_id, "deleted": True}

    return server


if __name__ == "__main__":
    make_server().run()
