/**
 * TypeScript shapes of the ext_proc messages jetroute reads and writes, as the proto loader
 * presents them (snake_case, oneofs named by `oneofs: true`). Only the fields we use are typed;
 * everything else passes through untouched.
 */

export interface HeaderValue {
  key: string;
  value?: string;
  /** Newer Envoy sends header values as bytes here; read it first. */
  raw_value?: Buffer | Uint8Array;
}

export interface HeaderMap {
  headers?: HeaderValue[];
}

export interface HttpHeaders {
  headers?: HeaderMap;
  end_of_stream?: boolean;
}

export interface HttpBody {
  body?: Buffer | Uint8Array;
  end_of_stream?: boolean;
}

/** protobufjs' built-in google.protobuf.Struct: camelCase even with keepCase. */
export interface ProtoStruct {
  fields: Record<string, ProtoValue>;
}
export type ProtoValue =
  | { stringValue: string }
  | { numberValue: number }
  | { boolValue: boolean }
  | { structValue: ProtoStruct }
  | { listValue: { values: ProtoValue[] } }
  | { nullValue: 0 | "NULL_VALUE" };

export interface Metadata {
  filter_metadata?: Record<string, ProtoStruct>;
}

export interface ProcessingRequest {
  request_headers?: HttpHeaders;
  response_headers?: HttpHeaders;
  request_body?: HttpBody;
  response_body?: HttpBody;
  request_trailers?: unknown;
  response_trailers?: unknown;
  metadata_context?: Metadata;
  /** Set by the loader's `oneofs: true`: which phase this message carries. */
  request?: "request_headers" | "response_headers" | "request_body" | "response_body" | "request_trailers" | "response_trailers";
}

export interface HeaderValueOption {
  header: HeaderValue;
  /** APPEND_IF_EXISTS_OR_ADD (0), ADD_IF_ABSENT, OVERWRITE_IF_EXISTS_OR_ADD, OVERWRITE_IF_EXISTS. */
  append_action?: "APPEND_IF_EXISTS_OR_ADD" | "ADD_IF_ABSENT" | "OVERWRITE_IF_EXISTS_OR_ADD" | "OVERWRITE_IF_EXISTS";
}

export interface HeaderMutation {
  set_headers?: HeaderValueOption[];
  remove_headers?: string[];
}

export interface BodyMutation {
  body?: Buffer;
  clear_body?: boolean;
}

export interface CommonResponse {
  status?: "CONTINUE" | "CONTINUE_AND_REPLACE";
  header_mutation?: HeaderMutation;
  body_mutation?: BodyMutation;
  clear_route_cache?: boolean;
}

export interface ImmediateResponse {
  status: { code: number | string };
  headers?: HeaderMutation;
  body?: Buffer;
  details?: string;
}

export interface ProcessingResponse {
  request_headers?: { response?: CommonResponse };
  response_headers?: { response?: CommonResponse };
  request_body?: { response?: CommonResponse };
  response_body?: { response?: CommonResponse };
  request_trailers?: Record<string, never>;
  response_trailers?: Record<string, never>;
  immediate_response?: ImmediateResponse;
  dynamic_metadata?: ProtoStruct;
}
