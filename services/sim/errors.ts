/** Errors in the body shape vLLM's OpenAI server uses: `{"error":{message,type,param,code}}`, code = HTTP status. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly type: string,
    message: string,
    readonly param: string | null = null,
  ) {
    super(message);
  }

  body(): { error: { message: string; type: string; param: string | null; code: number } } {
    return { error: { message: this.message, type: this.type, param: this.param, code: this.status } };
  }
}

export const badRequest = (message: string, param: string | null = null): ApiError =>
  new ApiError(400, "BadRequestError", message, param);

export const modelNotFound = (model: string): ApiError =>
  new ApiError(404, "NotFoundError", `The model \`${model}\` does not exist.`, "model");
