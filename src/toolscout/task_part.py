"""A request cut from a longer task, as multi-request splitting (`toolscout.intents`) makes them.

A `TaskPart` is a plain `str` (the request's own text: what BM25 and every other retriever read) that
also knows the task it was cut from and where. An encoder that can pool token vectors uses that to embed
the part from the task's own forward pass (late chunking: the mean of the task's token vectors over the
part's characters) instead of running the model on the part again; any other reader just sees text.
"""

from __future__ import annotations


class TaskPart(str):
    """`task[start:end]`, remembering `task`, `start` and `end`."""

    task: str
    start: int
    end: int

    def __new__(cls, task: str, start: int, end: int) -> "TaskPart":
        if not 0 <= start < end <= len(task):
            raise ValueError(f"a task part needs 0 <= start < end <= {len(task)}, got {start}:{end}")
        part = super().__new__(cls, task[start:end])
        part.task, part.start, part.end = str(task), int(start), int(end)
        return part

    @classmethod
    def find(cls, task: str, text: str) -> "TaskPart | str":
        """`text` as a part of `task` when `task` contains it (its first occurrence), else `text` itself."""
        start = task.find(text) if text else -1
        return cls(task, start, start + len(text)) if start >= 0 else text

    @property
    def cache_key(self) -> tuple[str, str, int, int]:
        """What its vector depends on (its text alone does not say: the same words cut from two tasks)."""
        return ("part", self.task, self.start, self.end)

    def __reduce__(self):  # pickle and copy keep the task and span
        return (TaskPart, (self.task, self.start, self.end))
