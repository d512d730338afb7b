"""Server stage: websockets + uvloop serve loop, HTTP endpoints on the same port, one handler per connection."""
