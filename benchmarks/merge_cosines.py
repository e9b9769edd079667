"""MiniLM cosines behind the merge thresholds: the catalogue's most similar distinct pairs,
and a few paraphrased capability definitions.

    python -m benchmarks.merge_cosines
"""

from __future__ import annotations

import itertools

from services.contrast.deterministic import CATALOGUE
from services.contrast.merge import capability_text
from shared import embeddings

PARAPHRASES = [
    (
        "recover_from_tool_errors: Retry a failed tool call until it works.",
        "handle_tool_failures: When a tool returns an error, fix the call and try again.",
    ),
    (
        "ask_for_missing_information: Ask the user when a required detail is missing.",
        "request_clarification: Query the user for details the task did not give before acting.",
    ),
    (
        "report_result_to_user: Tell the user what was done.",
        "confirm_outcome: Finish by telling the user the result of the actions.",
    ),
]


def main() -> None:
    sim = embeddings.EmbeddingSimilarity(embeddings.default_embedder())
    pairs = sorted(
        (
            (sim(capability_text(a.name, a.definition), capability_text(b.name, b.definition)),
             a.name, b.name)
            for a, b in itertools.combinations(CATALOGUE, 2)
        ),
        reverse=True,
    )  # fmt: skip
    print("most similar distinct catalogue pairs:")
    for score, a, b in pairs[:3]:
        print(f"  {score:.3f}  {a} ~ {b}")
    print("paraphrases:")
    for a, b in PARAPHRASES:
        print(f"  {sim(a, b):.3f}  {a.split(':')[0]} ~ {b.split(':')[0]}")


if __name__ == "__main__":
    main()
