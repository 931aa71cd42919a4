"""The methods the best-effort policy (:mod:`nvplugin.allocator.besteffort`) answers with: each
exact on the nodes it takes, or within a time budget, and all answering the one objective of
docs/allocation.md."""
