"""Where the shared corpus lives: $QC_CORPUS, else ../shared/corpus beside the checkout, else /work/shared/corpus.

Corpus tests skip when none exists; they never copy the models into the project."""
import os

_HERE = os.path.dirname(os.path.abspath(__file__))
_CANDIDATES = [os.environ.get("QC_CORPUS", ""), os.path.join(_HERE, "..", "..", "shared", "corpus"), "/work/shared/corpus"]
CORPUS = next((os.path.abspath(p) for p in _CANDIDATES if p and os.path.isdir(p)), "/work/shared/corpus")


def corpus_file(model: str, name: str = "model.onnx") -> str:
    return os.path.join(CORPUS, model, name)
