"""An app for the publish command's tests (imported by ``--app``)."""

from pydantic import BaseModel

from broker_jobs import App


class Note(BaseModel):
    text: str


def make(namespace: str) -> App:
    app = App(namespace=namespace)
    app.declare("note.add", Note)
    return app


app = make("clipublish")
