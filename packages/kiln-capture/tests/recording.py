"""A backend that records the graphs it is given and runs them as they are."""


class Recorder:
    def __init__(self):
        self.graphs = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return gm.forward
