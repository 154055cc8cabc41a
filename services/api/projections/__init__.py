"""The API's read models (CQRS): pure folds over the log's events, rebuilt by replay."""

from services.api.projections.model import Outcome, ReadModels, Watermark

__all__ = ["Outcome", "ReadModels", "Watermark"]
