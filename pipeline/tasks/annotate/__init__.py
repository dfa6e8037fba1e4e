"""Annotate: shape comments on `Model.forward`, the reasoning trace, FLOPs the counter leaves out,
and the shape facts row audits check row text against."""
