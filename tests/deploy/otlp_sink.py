"""The compose test's stand-in for Jaeger (whose image cannot be had here): the tests'
OTLP/gRPC receiver listening on 0.0.0.0:4317 in a container, appending every span it
receives to a JSON-lines file the host reads (`python -m tests.deploy.otlp_sink OUT`)."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

from tests.otlp_receiver import OtlpReceiver


def main(out: Path) -> None:
    receiver = OtlpReceiver("0.0.0.0:4317").start()
    written = 0
    while True:
        spans = receiver.spans()
        if len(spans) > written:
            with out.open("a") as sink:
                for span in spans[written:]:
                    sink.write(json.dumps(asdict(span)) + "\n")
            written = len(spans)
        time.sleep(0.5)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
