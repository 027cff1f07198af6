class Counter:
    def __init__(self, start: int = 0) -> None:
        self.value = start

    def add(self, n: int = 1) -> int:
        self.value += n
        return self.value
