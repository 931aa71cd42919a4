"""Hostile inputs shared by the reliability tests."""

from __future__ import annotations

# 575 bytes that expand to 10^9 nodes if every alias is followed.
ALIAS_BOMB = "\n".join(
    [
        'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]',
        *(
            f"{chr(c)}: &{chr(c)} [{','.join(['*' + chr(c - 1)] * 9)}]"
            for c in range(ord("b"), ord("j"))
        ),
        "gpus: *i",
    ]
)
