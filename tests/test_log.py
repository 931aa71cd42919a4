"""Logging: JSON lines by default, console rendering on request, no locals in tracebacks."""

from __future__ import annotations

import io
import json

import structlog

from nvplugin.log import configure, get_logger, resolve_format


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_json_lines_with_event_first_and_level_filter() -> None:
    out = io.StringIO()
    assert configure(None, "info", out) == "json"
    log = get_logger("nvplugin.test")
    log.debug("hidden", x=1)
    log.info("registered with kubelet", registrations=3)
    lines = out.getvalue().splitlines()
    assert len(lines) == 1
    record = json.loads(lines[0])
    assert list(record)[:4] == ["timestamp", "level", "event", "logger"]
    assert record["event"] == "registered with kubelet"
    assert record["registrations"] == 3 and record["level"] == "info"
    configure(None, "debug", out)  # reconfigure: existing loggers follow
    log.debug("now shown")
    assert json.loads(out.getvalue().splitlines()[-1])["event"] == "now shown"


def test_console_on_a_tty_or_when_asked() -> None:
    assert resolve_format(None, Tty()) == "console"
    assert resolve_format(None, io.StringIO()) == "json"
    assert resolve_format("json", Tty()) == "json"
    out = io.StringIO()
    assert configure("console", "info", out) == "console"
    get_logger("nvplugin.test").info("hello", gpu=3)
    text = out.getvalue()
    assert "hello" in text and "gpu=3" in text and not text.startswith("{")


def test_tracebacks_carry_no_locals() -> None:
    for fmt in ("json", "console"):
        out = io.StringIO()
        configure(fmt, "info", out)
        secret = "GPU-secret-value"
        try:
            raise ValueError("boom")
        except ValueError:
            structlog.get_logger("t").exception("failed")
        text = out.getvalue()
        assert "boom" in text and "Traceback" in text
        assert secret not in text
