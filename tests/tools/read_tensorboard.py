#!/usr/bin/env python3
"""Prints the scalars and texts of a TensorBoard event file as TensorBoard itself reads them, for tests of bridge's
writer.

Usage: read_tensorboard.py <event file or log dir>

Output (stdout, one JSON object): {"file_version": 2.0, "scalars": [{"tag": ..., "step": ..., "value": ...,
"wall_time": ...}, ...], "texts": [{"tag": ..., "step": ..., "text": ...}, ...]} ordered by tag, then as read; texts
are the tags the text plugin claims. Non-finite values are the strings "nan", "inf", "-inf"
(JSON has no literal for them). Exit status 3 when the tensorboard package is missing.
"""
import json
import math
import sys

try:
    from tensorboard.backend.event_processing import event_accumulator
    from tensorboard.util import tensor_util
except ImportError as error:
    sys.stderr.write(f"read_tensorboard.py: cannot import tensorboard ({error}); run scripts/install_deps.sh, which "
                     "creates <repo>/.venv with it\n")
    sys.exit(3)


def as_json_number(value):
    return value if math.isfinite(value) else repr(value)


def main():
    if len(sys.argv) != 2:
        sys.stderr.write(__doc__)
        sys.exit(2)
    # 0 = keep every scalar (the default keeps a sample of 10,000 per tag).
    accumulator = event_accumulator.EventAccumulator(
        sys.argv[1], size_guidance={event_accumulator.SCALARS: 0, event_accumulator.TENSORS: 0})
    accumulator.Reload()
    scalars = []
    for tag in sorted(accumulator.Tags()[event_accumulator.SCALARS]):
        for event in accumulator.Scalars(tag):
            scalars.append({"tag": tag, "step": event.step, "value": as_json_number(event.value),
                            "wall_time": event.wall_time})
    texts = []
    try:
        text_tags = accumulator.PluginTagToContent("text")
    except KeyError:  # no text in the file
        text_tags = {}
    for tag in sorted(text_tags):
        for event in accumulator.Tensors(tag):
            values = tensor_util.make_ndarray(event.tensor_proto).reshape(-1)
            texts.append({"tag": tag, "step": event.step, "text": [v.decode("utf-8") for v in values]})
    json.dump({"file_version": accumulator.file_version, "scalars": scalars, "texts": texts}, sys.stdout)


if __name__ == "__main__":
    main()
