"""Exception kinds of qcompiler.

User-facing failures (bad model, bad data, unknown pass, a wrong argument to the Python API) derive from
`QCompilerError`: the CLI prints their message as one line and exits with code 2. `PassError` (a pass failed or
broke the graph) is one line and exit 1. Anything else is a bug: the CLI prints one line naming the exception
and a file holding the full traceback, and exits 1 (cli.py).
"""


class QCompilerError(Exception):
    """A problem with the user's input or request; the message names the file, node, value or sample."""


class ModelLoadError(QCompilerError):
    """The file is not a readable ONNX model (missing, truncated, not protobuf, unsafe external data)."""


class InvalidModelError(QCompilerError):
    """The model parses but is not a valid graph (dangling input, cycle, duplicate output name)."""


class UnknownPassError(QCompilerError):
    """A pipeline names a pass that no registry knows."""


class PipelineError(UnknownPassError):
    """A pipeline whose passes' contracts do not hold in its order (a pass requires what no earlier pass
    ensures), or a recipe that cannot be placed."""


class PatternError(QCompilerError):
    """A pattern name or pattern definition is unknown or malformed."""


class OnnxRuntimeError(InvalidModelError):
    """onnxruntime refuses to load the model (unknown op, domain or opset, an attribute of the wrong type, tensor
    data that does not fit its shape, an input without a type); the message names the model and gives
    onnxruntime's reason (qcompiler/ort_session.py)."""


class DataError(QCompilerError):
    """Calibration or verification data does not fit the model (names the input and sample)."""


class ConfigError(QCompilerError):
    """A quantization config file is malformed (names the file and key)."""


class ArgumentError(ConfigError):
    """A Python API call got an argument of the wrong type or out of range (`quantize(None, ...)`,
    `weight_bits=8.0`, `per_channel='no'`, `limit=-1`); the message names the argument and what it accepts.
    A ConfigError because the arguments of `quantize` are the settings a config file would give."""


class InvariantError(AssertionError):
    """The IR's structural invariants do not hold: a bug in a pass or in the IR itself."""


class PassError(Exception):
    """A pass failed or broke the graph; the message names the pass and the passes before it."""


class VerificationError(PassError):
    """A pass changed the model's numerical results although it claims to preserve semantics."""


class OutputError(QCompilerError):
    """An output cannot be written safely: it would land on an input, is not a regular file, or has no folder."""


class ProducedModelError(PassError):
    """onnxruntime refuses a model qcompiler itself made from an input that ran: a bug in qcompiler (exit 1, one
    line), not bad input."""
