"""The error of a job setting that cannot run: the launcher prints it as one line naming the flag, before any work."""


class JobConfigError(ValueError):
    pass
