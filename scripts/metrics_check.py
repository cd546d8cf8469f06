#!/usr/bin/env python3
"""Parse a cohort metrics scrape with the reference OpenMetrics parser.

Owns: turning `GET /metrics` text into one JSON line per sample, [name, labels, value], and
refusing text the parser refuses (exit 1, the parser's message on stderr). Used by
crates/cohort/tests/metrics.rs and by operators:

    curl -s http://127.0.0.1:9600/metrics | scripts/metrics_check.py

Needs the prometheus-client package (pip install prometheus-client); without it, exit 2.

    scrape text ──stdin──▶ text_string_to_metric_families ──▶ stdout: JSON lines
"""
import json
import sys

try:
    from prometheus_client.openmetrics.parser import text_string_to_metric_families
except ImportError as e:
    print(f"metrics_check: needs prometheus-client (pip install prometheus-client): {e}",
          file=sys.stderr)
    sys.exit(2)


def main() -> int:
    text = sys.stdin.read()
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                print(json.dumps([s.name, s.labels, s.value]))
    except Exception as e:  # the parser raises ValueError and friends on bad text
        print(f"metrics_check: not valid OpenMetrics text: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
