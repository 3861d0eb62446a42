"""TF Serving's gRPC contract: `tensorflow.serving.PredictionService` and `ModelService` on a `ModelRegistry`.

    server = grpc.server(...)
    services = add_services(server, registry, metrics=metrics)
    ...
    services.refuse_new_calls(); services.drain(f"127.0.0.1:{port}", 10.0); server.stop(grace)

The messages are tensorflow-serving-api's, so a client built from its stubs talks to this server as to
`tensorflow_model_server`. Each method, and where TF Serving's source says what it does (the cases are listed in
docs/TF_SERVING_CONFORMANCE.md "gRPC"):

  Predict           predict_util.cc RunPredict: the signature (FAILED_PRECONDITION if missing), the inputs
                    (proto_codec.py), `output_filter`, the loaded version's batcher (the same as REST's), the
                    response's model spec (name, version, resolved signature name). The client's deadline is the
                    request's deadline in the batcher: RESOURCE_EXHAUSTED if it passes in the queue, as TF
                    Serving's batching session, DEADLINE_EXCEEDED during the model call.
  GetModelMetadata  get_model_metadata_impl.cc: `metadata_field` must be ["signature_def"]; the response packs the
                    SavedModel's SignatureDefMap into an Any and names the version (no signature name).
  GetModelStatus    get_model_status_impl.cc: every version of the model, highest first, or the one asked for;
                    a version label is ignored, as there.
  Classify, Regress, MultiInference   INVALID_ARGUMENT with TF Serving's messages for a signature that is not a
                    classification or regression one (elmo_tf exports only predict signatures); UNIMPLEMENTED if a
                    model had such a signature (elmo_tf.serve runs Predict only).
  HandleReloadConfigRequest   UNIMPLEMENTED: restart the server with the new --model_config_file (TF Serving
                    reloads its ModelConfigList in place).

Errors are `ServeError`s turned into their canonical code (status_codes.py) with the message; a message longer
than 1024 characters is cut and ends in "...TRUNCATED", as TF Serving's ToGRPCStatus does. Predict, Classify,
Regress and MultiInference are counted in the metrics (`request_count` by status; `request_latency` with
API "Predict", ..., entrypoint "GRPC"), as in TF Serving's prediction_service_impl.cc; metadata and status
requests are not, as there. This module knows grpcio's servicer interface, not sockets (grpc_server.py).
"""

from __future__ import annotations

import secrets
import threading
import time
from typing import Callable, Optional

import grpc
from absl import logging
from google.protobuf import json_format
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_service_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2,
    prediction_service_pb2_grpc,
)

from elmo_tf.errors import ServeError
from elmo_tf.serving.metrics import Metrics
from elmo_tf.serving.servable import DEFAULT_SIGNATURE
from elmo_tf.serving.proto_codec import fill_predict_response, model_spec_version, parse_predict_request
from elmo_tf.serving.registry import ModelRegistry
from elmo_tf.serving.status_codes import status_code_name

SIGNATURE_DEF = "signature_def"  # the one metadata field TF Serving serves (GetModelMetadataImpl::kSignatureDef)
_MAX_MESSAGE = 1024  # TF Serving's ToGRPCStatus cuts longer error messages
_PROBE_KEY = "elmo-tf-drain-probe"  # the metadata key of Services.drain's probe calls
_PROBE_ANSWER = "drain probe"  # the UNAVAILABLE message a probe gets
_CLASSIFY = "tensorflow/serving/classify"
_REGRESS = "tensorflow/serving/regress"


def grpc_code(error: ServeError) -> grpc.StatusCode:
    """The gRPC status code of an error: its own `code`, else the one its HTTP status stands for."""
    return grpc.StatusCode[error.code or status_code_name(error.status)]


def _message(text: str) -> str:
    return text if len(text) <= _MAX_MESSAGE else text[:_MAX_MESSAGE] + "...TRUNCATED"


def _require_spec(request) -> None:
    if not request.HasField("model_spec"):
        raise ServeError(400, "Missing ModelSpec")


class _Api:
    """What the two services share: the registry, the metrics, how a call's errors become gRPC statuses, and the
    count of calls being answered or refused (for `Services.drain`)."""

    def __init__(self, registry: ModelRegistry, metrics: Optional[Metrics], as_tensor_content: bool):
        self.registry = registry
        self.metrics = metrics
        self.as_tensor_content = as_tensor_content
        self.probe = (_PROBE_KEY, secrets.token_hex(16))  # the metadata of drain probes (only this server's)
        self.lock = threading.Condition()
        self.answering = 0  # calls being answered
        self.refused = 0  # calls refused since refusing began (probes not counted)
        self.refusing = False

    def call(self, context: grpc.ServicerContext, api: Optional[str], model_name: str, answer: Callable[[], object]):
        """Runs `answer`; a ServeError (or any failure) becomes the call's status. `api`: counted in the metrics under
        that name (None: not counted)."""
        started = time.monotonic()
        status, code = 200, None
        with self.lock:
            refused = self.refusing
            if not refused:
                self.answering += 1
        probe = refused and self.probe in context.invocation_metadata()
        if refused and not probe:
            with self.lock:
                self.refused += 1
        try:
            if refused:
                raise ServeError(503, _PROBE_ANSWER if probe else "The server is shutting down.")
            return answer()
        except ServeError as e:
            status, code = e.status, e.code
            context.abort(grpc_code(e), _message(str(e)))
        except grpc.RpcError:
            raise  # context.abort's own exception
        except Exception as e:  # noqa: BLE001 - any failure is the call's INTERNAL status, never a dead call
            status = 500
            logging.exception("gRPC %s failed", api or "call")
            context.abort(grpc.StatusCode.INTERNAL, _message(f"{type(e).__name__}: {e}"))
        finally:
            if api is not None and self.metrics is not None and not probe:
                self.metrics.observe_request(model_name, api, status, time.monotonic() - started, entrypoint="GRPC",
                                             code=code)
            if not refused:
                with self.lock:
                    self.answering -= 1
                    self.lock.notify_all()


class PredictionService(prediction_service_pb2_grpc.PredictionServiceServicer):
    """tensorflow.serving.PredictionService on a registry (see the module docstring)."""

    def __init__(self, api: _Api):
        self._api = api

    def Predict(self, request, context):  # noqa: N802 - the gRPC method's name
        return self._api.call(context, "Predict", request.model_spec.name, lambda: self._predict(request, context))

    def _predict(self, request, context):
        _require_spec(request)
        version, label = model_spec_version(request.model_spec)
        response = predict_pb2.PredictResponse()
        with self._api.registry.acquire(request.model_spec.name, version, label) as loaded:
            signature, inputs, aliases = parse_predict_request(request, loaded.model.signatures)
            remaining = context.time_remaining()  # None: the client set no deadline
            deadline_s = None if remaining is None else max(0.0, remaining)
            outputs = loaded.batcher.predict(signature, inputs, deadline_s=deadline_s)
            fill_predict_response(response, request.model_spec.name, loaded.version, signature, outputs, aliases,
                                  self._api.as_tensor_content)
        return response

    def GetModelMetadata(self, request, context):  # noqa: N802
        return self._api.call(context, None, request.model_spec.name, lambda: self._metadata(request))

    def _metadata(self, request):
        _require_spec(request)
        if not request.metadata_field:
            raise ServeError(400, "GetModelMetadataRequest must specify at least one metadata_field")
        for field in request.metadata_field:
            if field != SIGNATURE_DEF:
                raise ServeError(400, f"Metadata field {field} is not supported")
        version, label = model_spec_version(request.model_spec)
        response = get_model_metadata_pb2.GetModelMetadataResponse()
        with self._api.registry.acquire(request.model_spec.name, version, label) as loaded:
            response.model_spec.name = loaded.name
            response.model_spec.version.value = loaded.version
            response.metadata[SIGNATURE_DEF].Pack(loaded.model.signature_defs)
        return response

    def Classify(self, request, context):  # noqa: N802
        return self._api.call(context, "Classify", request.model_spec.name, lambda: self._refuse(request, _CLASSIFY))

    def Regress(self, request, context):  # noqa: N802
        return self._api.call(context, "Regress", request.model_spec.name, lambda: self._refuse(request, _REGRESS))

    def _refuse(self, request, method: str):
        _require_spec(request)
        return self._not_predict(request.model_spec, method)

    def MultiInference(self, request, context):  # noqa: N802
        spec = request.tasks[0].model_spec if request.tasks else None
        return self._api.call(context, "MultiInference", spec.name if spec else "",
                              lambda: self._multi_inference(request))

    def _multi_inference(self, request):
        if not request.tasks:
            raise ServeError(400, "ModelSpec has no name specified.")
        for task in request.tasks:
            if task.method_name not in (_CLASSIFY, _REGRESS):
                raise ServeError(501, f"Unsupported signature method_name: {task.method_name}")
        task = request.tasks[0]
        return self._not_predict(task.model_spec, task.method_name)

    def _not_predict(self, model_spec, method: str):
        """Classify and Regress: TF Serving's signature checks (classifier.cc, regressor.cc), which no elmo_tf
        signature passes; one that did would still not be run."""
        version, label = model_spec_version(model_spec)
        with self._api.registry.acquire(model_spec.name, version, label) as loaded:
            name = model_spec.signature_name or DEFAULT_SIGNATURE
            defs = loaded.model.signature_defs.signature_def
            if name not in defs:
                raise ServeError(400, f"No signature was found with the name: {name}")
            signature = defs[name]
            kind = "classification" if method == _CLASSIFY else "regression"
            if len(signature.inputs) != 1:
                raise ServeError(400, "Expected one input Tensor.")
            if method == _CLASSIFY and len(signature.outputs) not in (1, 2):
                raise ServeError(400, f"Expected one or two output Tensors, found {len(signature.outputs)}")
            if method == _REGRESS and len(signature.outputs) != 1:
                raise ServeError(400, "Expected one output Tensor.")
            if "inputs" not in signature.inputs:
                raise ServeError(400, f"No {kind} inputs found in SignatureDef: {signature}")
        raise ServeError(501, f"elmo_tf.serve runs Predict only; use Predict with signature {name!r}.")


class ModelService(model_service_pb2_grpc.ModelServiceServicer):
    """tensorflow.serving.ModelService on a registry (see the module docstring)."""

    def __init__(self, api: _Api):
        self._api = api

    def GetModelStatus(self, request, context):  # noqa: N802
        return self._api.call(context, None, request.model_spec.name, lambda: self._status(request))

    def _status(self, request):
        _require_spec(request)
        spec = request.model_spec
        version = spec.version.value if spec.HasField("version") else None
        status = self._api.registry.status(spec.name, version)
        return json_format.ParseDict(status, get_model_status_pb2.GetModelStatusResponse())

    def HandleReloadConfigRequest(self, request, context):  # noqa: N802
        return self._api.call(context, None, "", self._reload)

    @staticmethod
    def _reload():
        raise ServeError(501, "elmo_tf.serve does not reload its model config while running; restart it with the new "
                              "--model_config_file (new versions under a base path are picked up without a restart).")


class Services:
    """PredictionService and ModelService on a registry, as added to a grpcio server by `add_services`.

    Stopping: grpcio's `server.stop` makes grpc's core cancel (CANCELLED, not UNAVAILABLE) every call that has
    reached it but that grpcio's poller thread has not yet taken, which on a busy server can be most of the calls
    clients just sent, and a client cannot tell whether a cancelled call ran. So `refuse_new_calls`, then `drain`,
    then `server.stop`.
    """

    def __init__(self, api: _Api):
        self._api = api

    def refuse_new_calls(self) -> None:
        """From now on every call is answered UNAVAILABLE at once; the calls already being answered go on."""
        with self._api.lock:
            self._api.refusing = True

    def drain(self, target: str, most_s: float) -> None:
        """Returns once no call waits in grpc's core any more and every call taken has been answered, or after
        `most_s` if calls go on arriving (call after `refuse_new_calls`). `target`: this server's address.

        grpcio takes the calls waiting in core in arrival order, so a probe call sent to each method (to this
        server, recognised by a secret in its metadata) comes back once every call that arrived before it has been
        taken; rounds of probes go on until one round took no call, i.e. until none arrived during the last round.
        """
        api = self._api
        give_up = time.monotonic() + most_s
        with grpc.insecure_channel(target) as channel:
            methods = [channel.unary_unary(m, request_serializer=None, response_deserializer=None) for m in _METHODS]
            while True:
                refused = api.refused
                probes = [m.future(b"", timeout=max(0.0, give_up - time.monotonic()), metadata=(api.probe,))
                          for m in methods]
                for probe in probes:
                    if probe.code() != grpc.StatusCode.UNAVAILABLE or probe.details() != _PROBE_ANSWER:
                        if give_up > 0.0:
                            logging.warning("Stopping the gRPC server with calls possibly still waiting: a drain "
                                            "probe to %s came back %s (%s).", target, probe.code().name,
                                            probe.details())
                        give_up = 0.0
                with api.lock:
                    while api.answering:
                        api.lock.wait()
                if api.refused == refused or time.monotonic() >= give_up:
                    return


_METHODS = [f"/{service.full_name}/{method.name}"  # every method of the two services, each probed by a drain
            for module in (prediction_service_pb2, model_service_pb2)
            for service in module.DESCRIPTOR.services_by_name.values() for method in service.methods]


def add_services(server: grpc.Server, registry: ModelRegistry, metrics: Optional[Metrics] = None,
                 as_tensor_content: bool = False) -> Services:
    """Adds PredictionService and ModelService for `registry` to a grpcio server. `as_tensor_content`: outputs as
    bytes in `tensor_content` instead of the typed value fields (TF Serving's --enable_serialization_as_tensor_content).
    The returned `Services` stop them (see there) before the server stops."""
    api = _Api(registry, metrics, as_tensor_content)
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(PredictionService(api), server)
    model_service_pb2_grpc.add_ModelServiceServicer_to_server(ModelService(api), server)
    return Services(api)
