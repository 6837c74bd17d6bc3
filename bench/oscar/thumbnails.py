"""A thumbnailer that answers the original image: the bench's products have no images.

Oscar's templates ask for a thumbnail of the "image not found" placeholder on
every basket and checkout page; resizing it (sorl-thumbnail, easy-thumbnails)
would put image work into a checkout measurement.
"""

from dataclasses import dataclass

from oscar.core.thumbnails import AbstractThumbnailer


@dataclass(frozen=True)
class _Image:
    url: str
    width: int = 0
    height: int = 0


class Original(AbstractThumbnailer):
    def generate_thumbnail(self, source, **opts):
        return _Image(url=getattr(source, "url", str(source)))

    def delete_thumbnails(self, source):
        return None
