"""This folder's config on tiny local models, offline: the hub ids replaced by a tiny Llama base and
three fine-tunes of it (``mergekit_mergeability.tiny``), the probes as they are. The precheck runs
end to end in about a minute on a CPU; the tiny models' numbers mean nothing (random weights), the
mechanics are the real ones. The test suite runs it (tests/test_own_config.py).

    python examples/own-config/tiny.py --out /tmp/own-config
"""

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
HUB = {  # the config's hub ids -> the tiny model standing in for each
    "mistralai/Mistral-7B-v0.1": "base",
    "teknium/OpenHermes-2.5-Mistral-7B": "expert0",
    "meta-math/MetaMath-Mistral-7B": "expert1",
    "HuggingFaceH4/zephyr-7b-beta": "expert2",
}
# zephyr's chat template, in short: the tiny expert standing in for it is asked through it (chat: true)
TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def tiny_config(folder: Path) -> Path:
    """The config and its probes copied to ``folder``, its models tiny local folders there."""
    import transformers

    from mergekit_mergeability.tiny import make_family

    folder.mkdir(parents=True, exist_ok=True)
    shutil.copytree(HERE / "probes", folder / "probes", dirs_exist_ok=True)
    models = make_family(folder / "models", "llama", experts=3)
    tokenizer = transformers.AutoTokenizer.from_pretrained(models["expert2"])
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(models["expert2"])
    text = (HERE / "config.yml").read_text().replace("dtype: bfloat16", "dtype: float32")
    for hub_id, tiny in HUB.items():
        assert hub_id in text, hub_id
        text = text.replace(hub_id, str(models[tiny]))
    config = folder / "config.yml"
    config.write_text(text)
    return config


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("own-config-tiny"), help="where the models and reports go")
    args = parser.parse_args()
    config = tiny_config(args.out)
    command = [
        sys.executable,
        "-m",
        "mergekit_mergeability",
        "precheck",
        str(config),
        "--out",
        str(args.out / "precheck"),
    ]
    print(" ".join(command[2:]))
    raise SystemExit(subprocess.call(command))


if __name__ == "__main__":
    main()
