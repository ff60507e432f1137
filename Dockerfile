# genrm-grpc server image. Build: docker build -t genrm-grpc .
# Run:   docker run -p 50051:50051 -v $PWD/server.yaml:/etc/genrm/server.yaml genrm-grpc
FROM python:3.11-slim AS runtime

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app

COPY constraints.txt pyproject.toml README.md ./
COPY clients/python ./clients/python
COPY genrm_grpc ./genrm_grpc
RUN pip install -c constraints.txt ./clients/python . \
    && useradd --system --uid 10001 genrm
USER genrm

EXPOSE 50051
HEALTHCHECK --interval=10s --timeout=5s CMD ["genrm-grpc", "health", "--target", "127.0.0.1:50051"]
ENTRYPOINT ["genrm-grpc", "serve"]
CMD ["--config", "/etc/genrm/server.yaml", "--listen", "0.0.0.0:50051"]
