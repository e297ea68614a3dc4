"""The torch.compile front end: ``torch.compile(model, backend="thunder_core")``.

Registered through the ``torch_dynamo_backends`` entry point, so a fresh process can use the
name without importing thunder_core first. See docs/torch-compile.md.
"""

from thunder_core.dynamo.compiler import OPTIONS, CompileReport, ThunderCompiler, backend, report_for

__all__ = ["OPTIONS", "CompileReport", "ThunderCompiler", "backend", "report_for"]
