"""What a llama.cpp build keeps of greedy decoding, through the real server (issue 48): at T=0,
12 long prompts (notes from the structured-output corpus, then one of its prompts: about 380 to
640 tokens) answered by `lmsp serve` with its defaults and with `--draft off`, and 5 of them
answered alone, then each beside 7 other streams. A script, not a benchmark:

    python bench/scripts/build_guarantees.py [--lib DIR] [--draft auto|ngram]

`--lib`: llama.cpp's libraries to run on (LLAMA_CPP_LIB_PATH; default the installed wheel's),
e.g. the bench's native build without our patch (bench/lib/llama_server.py). `--draft ngram`
drafts whatever the kernel check said, to see what `auto` avoids.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "support"))
from fixture_files import json_schema_corpus
from lmsp.testing import RunningServer, isolated_env, start_server

MODEL = "smollm2:135m-instruct-q4_1"
MAX_TOKENS = 64


def prompts() -> list[str]:
    corpus = [c["prompt"] for c in json_schema_corpus()]
    out = []
    for i in range(12):
        # the other prompts as notes, 30 to 52 of them from the corpus's start on, over again
        notes = [corpus[(i + 1 + j) % len(corpus)] for j in range(30 + 2 * i)]
        out.append(f"Task {i + 1}. Notes from earlier, for reference only:\n\n" + "\n".join(notes) + "\n\n" + corpus[i])
    return out


def answer(url: str, text: str) -> str:
    body = {
        "model": MODEL,
        "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}],
        "temperature": 0,
        "max_output_tokens": MAX_TOKENS,
    }
    done = httpx.post(f"{url}/lmsp/v1/responses", json=body, timeout=600)
    done.raise_for_status()
    response = done.json()
    return (
        "".join(part["text"] for item in response["output"] if item["type"] == "message" for part in item["content"])
        + f" [{response['usage']['input_tokens']} in]"
    )


def serve(workdir: Path, lib: str | None, *args: str) -> RunningServer:
    extra = {"LLAMA_CPP_LIB_PATH": lib} if lib else {}
    workdir.mkdir()
    return start_server(workdir, "--no-discover", "--parallel", "8", *args, env=isolated_env(workdir / "u", **extra))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lib", default=None)
    parser.add_argument("--draft", default="auto", choices=("auto", "ngram"))
    args = parser.parse_args()
    texts = prompts()
    with tempfile.TemporaryDirectory() as tmp:
        default = serve(Path(tmp) / "a", args.lib, "--draft", args.draft)
        try:
            first = [answer(default.url, t) for t in texts]
            alone = first[:5]
            beside = []
            others = texts[5:12]
            with ThreadPoolExecutor(8) as pool:
                for text in texts[:5]:
                    futures = [pool.submit(answer, default.url, text)] + [
                        pool.submit(answer, default.url, o) for o in others
                    ]
                    beside.append(futures[0].result())
                    for f in futures[1:]:
                        f.result()
            print(next(line for line in default.log_path.read_text().splitlines() if "llama.cpp" in line))
        finally:
            default.stop()
        plain = serve(Path(tmp) / "b", args.lib, "--draft", "off")
        try:
            second = [answer(plain.url, t) for t in texts]
        finally:
            plain.stop()
    lengths = [int(a.rsplit("[", 1)[1].split()[0]) for a in first]
    differ = sum(a != b for a, b in zip(first, second, strict=True))
    same = sum(a == b for a, b in zip(alone, beside, strict=True))
    print(f"prompts of {min(lengths)}-{max(lengths)} tokens")
    print(f"--draft {args.draft} vs --draft off: {differ} of {len(texts)} answers differ")
    print(f"alone vs beside 7 streams: {same} of {len(alone)} the same")


if __name__ == "__main__":
    main()
