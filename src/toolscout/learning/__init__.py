"""Learning from use, as a channel of the pipeline of its own (`channel.py`): the requests feedback taught
(`memory.py`), what the deployment's own evidence is worth (`calibration.py`), what a request teaches
(`incidental.py`), where tasks and requests are compared (`space.py`), and the deployment's measurement of
its own learning (`scorecard.py`)."""

from .channel import CAUTIOUS_GATE, DEPTH, GATE, LearnedChannel, LearningSettings, Lesson, Lift, check_settings
from ..feedback import Scored
from .incidental import teaches_anything, teaching_events
from .memory import dormancy
from .scorecard import Scorecard

__all__ = ["LearnedChannel", "LearningSettings", "Lesson", "Lift", "Scored", "Scorecard", "GATE", "CAUTIOUS_GATE",
           "DEPTH", "check_settings", "dormancy", "teaches_anything", "teaching_events"]
